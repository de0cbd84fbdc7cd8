"""Long steps in a log file: plain lines at a steady interval instead of a spinner."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

from seer.watch.progress import step


def test_off_a_terminal_a_step_prints_start_ticks_and_end():
    """The block runs until three ticks were printed (however slowly the machine runs them)."""
    out = io.StringIO()
    console = Console(file=out, width=160)
    assert not console.is_terminal
    state = {"n": 0, "ticks": 0}

    def detail() -> str:
        state["ticks"] += 1
        return f"{state['n']} ready"

    with step(console, "Starting 2 vLLM instances [logs]", 0.05, detail=detail):
        deadline = time.monotonic() + 60
        while state["ticks"] < 3:
            assert time.monotonic() < deadline, out.getvalue()
            time.sleep(0.01)
        state["n"] = 1
    lines = out.getvalue().splitlines()
    assert lines[0] == "Starting 2 vLLM instances [logs] ..."  # no markup eaten, no escape codes
    ticks = [l for l in lines[1:-1] if re.fullmatch(r"Starting 2 vLLM instances \[logs\]: \d+ s, [01] ready", l)]
    assert len(ticks) == len(lines) - 2 >= 3
    assert re.fullmatch(r"Starting 2 vLLM instances \[logs\]: done in \d+\.\d s, 1 ready", lines[-1])


def test_a_failing_step_says_it_stopped():
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with step(Console(file=out, width=160), "training on iteration 3", 10.0):
            raise RuntimeError("boom")
    assert re.search(r"training on iteration 3: stopped after [\d.]+ s$", out.getvalue().strip())


def test_on_a_terminal_the_step_is_a_transient_spinner():
    out = io.StringIO()
    with step(Console(file=out, force_terminal=True, width=80), "loading weights", 0.01):
        time.sleep(0.05)
    assert "loading weights: " not in out.getvalue()  # no plain progress lines on a terminal
