"""The process guard: its server's whole process group dies with the guard, even a SIGKILLed one."""

from __future__ import annotations

import os
import signal
import time

from seer.procs import GuardedProcess


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _server_pids(tmp_path, proc: GuardedProcess) -> list[int]:
    """The pids the guarded shell wrote: itself and a background child in its group."""
    f = tmp_path / "pids"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if f.exists() and len(f.read_text().split()) == 2:
            return [int(p) for p in f.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"the guarded server did not start: {proc.log_tail()}")


def test_a_sigkilled_guard_still_takes_its_server_group_down(tmp_path):
    """Ray SIGKILLs a dead worker's direct children: the guard's sentinel must still act."""
    script = f"sleep 300 & echo $$ $! > {tmp_path}/pids; wait"
    proc = GuardedProcess("victim", ["bash", "-c", script], tmp_path / "victim.log")
    proc.start()
    pids = _server_pids(tmp_path, proc)
    assert all(_alive(p) for p in pids)
    os.kill(proc.proc.pid, signal.SIGKILL)  # no cleanup code of the guard runs
    proc.proc.wait(timeout=5)
    assert _wait_gone(pids, 15) == [], "the server outlived its SIGKILLed guard"


def test_a_stopped_guard_stops_its_server_and_leaves_no_sentinel(tmp_path):
    script = f"sleep 300 & echo $$ $! > {tmp_path}/pids; wait"
    proc = GuardedProcess("victim", ["bash", "-c", script], tmp_path / "victim.log")
    proc.start()
    pids = _server_pids(tmp_path, proc)
    guard = proc.proc.pid
    children = [int(d) for d in os.listdir("/proc") if d.isdigit() and _ppid(int(d)) == guard]
    proc.stop()
    assert _wait_gone(pids + children, 15) == []


def _ppid(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
