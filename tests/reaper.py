"""Run one command under a child subreaper, so that every process it ever starts stays findable.

`python -m tests.reaper -- COMMAND...` marks itself PR_SET_CHILD_SUBREAPER, starts COMMAND in a
session of its own (its output goes to the reaper's stderr), prints its pid on stdout, then reaps whatever ends below it
until its stdin closes. A process of the command's tree whose parent dies (a daemon's double fork,
a server whose guard was killed) is re-parented here, not to init: the reaper's process tree
(tests.sockets.process_tree) is every process of the command still alive, the command itself
included until it ends.
"""

from __future__ import annotations

import ctypes
import os
import select
import subprocess
import sys

_PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m tests.reaper -- COMMAND...", file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("tests.reaper: PR_SET_CHILD_SUBREAPER failed", file=sys.stderr)
        return 1
    proc = subprocess.Popen(argv[1:], stdin=subprocess.DEVNULL, stdout=sys.stderr, start_new_session=True)
    print(proc.pid, flush=True)
    while True:
        while True:  # reap every child that ended, the command and re-parented orphans alike
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)
        if ready and not sys.stdin.buffer.read1(1024):  # the test closed our stdin: done
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
