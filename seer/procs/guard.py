"""Process guard: runs one vLLM server and takes its whole process tree down with the parent.

vLLM's API server forks engine-core workers. If the Seer driver is killed with SIGKILL no
cleanup code of ours runs, so each server is started under this guard: the kernel signals the
guard when its parent dies (PR_SET_PDEATHSIG), and the guard kills the server's process group.
The guard also polls its parent id, in case the death signal was missed.

A guard can itself be SIGKILLed (Ray kills a dead worker's direct children), so it forks a
sentinel that is not its parent's child: the kernel signals the sentinel when the guard dies, and
the sentinel takes the server's process group down.

With `--cpus LIST` (e.g. `0` or `2,3`; ranges like `2-3` too) the guard pins itself, and so the
whole server it starts (API process, engine core, their threads), to those cores: an instance's
every thread stays on its own cores, so an idle instance is idle hardware, as on a cluster, and
never lends its cores to a busy one.

With `--pass-fd N` the command inherits the guard's descriptor N (a pipe of secrets for
seer.procs.secret_launch), which the guard closes once the command has it.

Usage: python -m seer.procs.guard PARENT_PID [--cpus LIST] [--pass-fd N] -- COMMAND...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from seer.procs.pdeathsig import set_parent_death_signal

KILL_GRACE_S = 10.0  # a requested stop: the server may shut down cleanly
ORPHAN_GRACE_S = 1.0  # its owner is gone (parent or guard died): nobody waits for a clean exit


def _kill_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _sentinel(pgid: int, guard_pid: int) -> None:
    """In a forked child: wait for the guard's death, then kill the server's group. Never returns."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # kept pending: no lost wake-up
        set_parent_death_signal(signal.SIGTERM)
        while os.getppid() == guard_pid:
            signal.sigtimedwait({signal.SIGTERM}, 1.0)
        for sig, wait in ((signal.SIGTERM, ORPHAN_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _group_alive(pgid):
                break
    finally:
        os._exit(0)


def parse_cpus(text: str) -> set[int]:
    """`0`, `0,1`, `2-3` or `0,2-3` -> the set of core ids; a clear error for anything else."""
    cores: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad CPU list {text!r}: expected core ids like '0', '0,1' or '2-3'")
        cores.update(range(int(lo), int(hi if sep else lo) + 1))
    return cores


def main(argv: list[str]) -> int:
    usage = "usage: python -m seer.procs.guard PARENT_PID [--cpus LIST] [--pass-fd N] -- COMMAND..."
    cpus = None
    if len(argv) >= 3 and argv[1] == "--cpus":
        try:
            cpus = parse_cpus(argv[2])
        except ValueError as e:
            print(f"{e}\n{usage}", file=sys.stderr)
            return 2
        argv = argv[:1] + argv[3:]
    fds: tuple[int, ...] = ()
    if len(argv) >= 3 and argv[1] == "--pass-fd":
        if not argv[2].isdigit():
            print(usage, file=sys.stderr)
            return 2
        fds = (int(argv[2]),)
        argv = argv[:1] + argv[3:]
    if len(argv) < 3 or argv[1] != "--":
        print(usage, file=sys.stderr)
        return 2
    parent = int(argv[0])
    set_parent_death_signal(signal.SIGTERM)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)  # inherited by the server and everything it starts
    proc = subprocess.Popen(argv[2:], start_new_session=True, pass_fds=fds)
    for fd in fds:
        os.close(fd)
    guard_pid = os.getpid()
    if os.fork() == 0:
        _sentinel(proc.pid, guard_pid)
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
    # A stop asked for while the parent lives is graceful; the parent's death (its PDEATHSIG, or
    # the poll) means a lost owner, such as a Ray actor on a lost node: no one waits for a clean exit.
    _kill_group(proc, KILL_GRACE_S if os.getppid() == parent else ORPHAN_GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
