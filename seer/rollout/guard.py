"""Process guard: runs one vLLM server and takes its whole process tree down with the parent.

vLLM's API server forks engine-core workers. If the Seer driver is killed with SIGKILL no
cleanup code of ours runs, so each server is started under this guard: the kernel signals the
guard when its parent dies (PR_SET_PDEATHSIG), and the guard kills the server's process group.
The guard also polls its parent id, in case the death signal was missed.

Usage: python -m seer.rollout.guard PARENT_PID -- COMMAND...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from seer.rollout.pdeathsig import set_parent_death_signal

KILL_GRACE_S = 10.0


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # the leader is gone; children of the group may linger
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m seer.rollout.guard PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    set_parent_death_signal(signal.SIGTERM)
    proc = subprocess.Popen(argv[2:], start_new_session=True)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    if os.getppid() != parent:  # parent died before we set the death signal
        stopping = True
    while not stopping:
        if proc.poll() is not None:
            return proc.returncode
        if os.getppid() != parent:
            break
        time.sleep(0.5)
    _kill_group(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
