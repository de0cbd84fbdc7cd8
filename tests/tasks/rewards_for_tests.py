"""Reward functions that tests name by `module:function`."""


def exact(response_text: str, reference: dict) -> float:
    return 1.0 if response_text.strip() == str(reference["answer"]) else 0.0


def boom(response_text: str, reference: dict) -> float:
    raise ValueError("reward exploded")


def not_a_number(response_text: str, reference: dict):
    return "high"


NOT_CALLABLE = 3
