"""Serve many agent sessions from one process (`agent.serve: true`), so that a command agent pays its
interpreter's start and its imports once per run instead of once per session.

Standard library only: a command agent in a virtual environment of its own can copy this file.
The protocol (docs/agents.md, "A command line that serves sessions"): frames of a 4-byte big-endian
length and a JSON object. Seer writes {"op": "start", "id", "base_url", "api_key", "model",
"record"} and {"op": "cancel", "id"} on the agent's stdin, and closes it at the run's end; the agent
writes one {"id", "reward": number or null, "error": text or null} per session on its stdout (at
most 16 KiB a frame). `serve(handle)` does all of it: `handle(session)` runs in a thread per session,
and the process exits when its stdin ends.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HEADER = struct.Struct(">I")
MAX_IN_BYTES = 16 << 20  # what Seer may send in one frame (a start carries the task record)
MAX_ERROR_CHARS = 1000  # as JSON with ASCII escapes, at most 12 bytes a character: well under 16 KiB


def serve(handle: Callable[[dict], Any], max_workers: int = 64) -> None:
    """Answer every session Seer starts with `handle(session)`'s return (a finite number or None: the
    task's reward decides); what it raises is that session's error. Returns when stdin ends."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the agent's prints go to its log, never into the frames
    lock = threading.Lock()

    def answer(sid: str, reward: Any, error: str | None) -> None:
        data = json.dumps({"id": sid, "reward": reward, "error": error}).encode()
        with lock:
            out.write(HEADER.pack(len(data)) + data)
            out.flush()

    def run(session: dict) -> None:
        reward, error = None, None
        try:
            value = handle(session)
            if value is not None:
                reward = float(value)
                if not math.isfinite(reward) or isinstance(value, bool):
                    reward, error = None, f"the agent returned {value!r}; expected a finite number or None"
        except BaseException as e:  # noqa: BLE001 - the session's own error
            text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            error = text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"
        answer(session["id"], reward, error)

    pool = ThreadPoolExecutor(max_workers)
    while True:
        head = inp.read(HEADER.size)
        if len(head) < HEADER.size:
            break
        (n,) = HEADER.unpack(head)
        if n > MAX_IN_BYTES:
            raise SystemExit(f"a frame of {n} bytes from Seer, over {MAX_IN_BYTES}")
        msg = json.loads(inp.read(n))
        if msg.get("op") == "start":
            pool.submit(run, msg)
        # "cancel": a thread cannot be stopped; Seer has scored the session already and ignores its answer
    # stdin ended: the run is over and every session scored; what still runs is abandoned
    sys.stderr.flush()
    os._exit(0)
