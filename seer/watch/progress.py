"""Progress of long steps: a spinner on a terminal, plain lines at a steady interval elsewhere.

A job under a cluster scheduler writes stdout to a file, where a transient spinner shows nothing
at all; there each step prints when it starts, every `interval_s` while it runs, and when it ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console


def _plain(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def step(console: Console, text: str, interval_s: float = 15.0,
         detail: Callable[[], str] | None = None) -> Iterator[None]:
    """Show `text` while the block runs; `detail()` (if given) is appended to each plain line."""
    if console.is_terminal:
        with console.status(text):
            yield
        return
    t0 = time.monotonic()
    stop = threading.Event()

    def line(state: str) -> str:
        extra = detail() if detail is not None else ""
        return f"{text}: {state}" + (f", {extra}" if extra else "")

    def tick() -> None:
        while not stop.wait(interval_s):
            _plain(console, line(f"{time.monotonic() - t0:.0f} s"))

    _plain(console, f"{text} ...")
    ticker = threading.Thread(target=tick, name="seer-progress", daemon=True)
    ticker.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        ticker.join()
        _plain(console, line(("done in" if ok else "stopped after") + f" {time.monotonic() - t0:.1f} s"))
