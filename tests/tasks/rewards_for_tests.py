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


def typed(response_text: str, reference: dict):
    """The reward named by the response: real numbers of every kind, and values no reward may be."""
    import decimal
    import fractions

    import numpy as np

    return {"np_float32": np.float32(0.5), "np_int64": np.int64(2), "np_float16": np.float16(0.25),
            "fraction": fractions.Fraction(1, 4), "decimal": decimal.Decimal("0.75"), "int": 3, "float": 1.5,
            "bool": True, "np_bool": np.bool_(True), "nan": float("nan"), "np_inf": np.float64("inf"),
            "huge": 10**400, "complex": 1j, "str": "1", "none": None}[response_text]
