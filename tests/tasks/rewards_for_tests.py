"""Reward functions that tests name by `module:function`."""


def exact(response_text: str, reference: dict) -> float:
    return 1.0 if response_text.strip() == str(reference["answer"]) else 0.0


def boom(response_text: str, reference: dict) -> float:
    raise ValueError("reward exploded")


def not_a_number(response_text: str, reference: dict):
    return "high"


NOT_CALLABLE = 3


def hang(response_text: str, reference: dict) -> float:
    """Far past any test's reward timeout (a runaway verifier)."""
    import time

    time.sleep(120)
    return 1.0


def exact_or_hang(response_text: str, reference: dict) -> float:
    """`exact`, except that the response "hang" never returns in time."""
    if response_text == "hang":
        return hang(response_text, reference)
    return exact(response_text, reference)


def exit_once(response_text: str, reference: dict) -> float:
    """`exact`, except that the first call (of all processes: a flag file) kills its worker process,
    as a segfault or the OOM killer would."""
    import os

    try:
        os.close(os.open(reference["flag"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return exact(response_text, reference)
    os._exit(1)


def dies_or_exits(response_text: str, reference: dict) -> float:
    """`exact`, except for responses that end their process or the program as user code can."""
    import os
    import sys

    if response_text == "die":
        os._exit(1)
    if response_text.startswith("exit"):
        sys.exit(int(response_text[4:]))
    if response_text == "interrupt":
        raise KeyboardInterrupt
    return exact(response_text, reference)
