"""A child process under seer.procs.guard, logging to a file: never orphaned.

Every long-lived helper process Seer starts (vLLM servers, mooncake_master and its store, the
DGDS server, a one-node Ray's head) goes through this one class, so all of them die with the
driver, even on SIGKILL. None inherits the driver's whole environment, only its allow-listed part
(seer.procs.environment), so a secret of the driver's stays in the driver; a secret Seer hands a
process (`secrets`) travels on a pipe (seer.procs.secret_launch), never in an environment or on a
command line that /proc shows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from seer.procs.environment import inherited
from seer.procs.secret_launch import secret_pipe


class GuardedProcess:
    def __init__(self, name: str, command: list[str], log_path: Path, env: dict[str, str] | None = None,
                 inherit_env: bool = True, cpus: str | None = None, secrets: dict[str, str] | None = None):
        """`env` on top of the allow-listed part of this process's environment (`inherit_env`, the
        default) or alone; `cpus`: pin the process and all its descendants to these cores
        (seer.procs.guard --cpus); `secrets`: variables the process finds in its `os.environ` but
        not in its exec environment (a `python -m MODULE` command only; seer.procs.secret_launch)."""
        if secrets and (len(command) < 3 or command[1] != "-m"):
            raise ValueError(f"{name}: secrets reach only a `python -m MODULE` command, not {command[:2]}")
        self.secrets = dict(secrets or {})
        self.name = name
        self.cpus = cpus
        self.command = command
        self.log_path = Path(log_path)
        self.env = env or {}
        self.inherit_env = inherit_env
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = inherited() if self.inherit_env else {}
        env.update(self.env)
        command, fds = self.command, ()
        if self.secrets:
            fd = secret_pipe(self.secrets)
            fds = (fd,)
            command = [command[0], "-m", "seer.procs.secret_launch", "--secret-fd", str(fd), *command[1:]]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "seer.procs.guard", str(os.getpid()),
                 *(["--cpus", self.cpus] if self.cpus else []), *(["--pass-fd", str(fds[0])] if fds else []),
                 "--", *command],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                pass_fds=fds,
            )
        finally:
            log.close()
            for fd in fds:
                os.close(fd)
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def terminate(self) -> None:
        """Ask the guard to stop its child (does not wait; `stop` does)."""
        if self.alive():
            self.proc.terminate()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the guard, which takes the child's whole process group down."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """Hard kill (fault injection): the guard never sees it, so kill the child's group too."""
        if self.proc is None:
            return
        for pid in _children(self.proc.pid):
            try:
                os.killpg(pid, signal.SIGKILL)  # the child leads its own process group
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(d.name))
    return out


def remote_error_line(e: BaseException) -> str:
    """An error from another process (a Ray actor's call) in one line, "Type: message": the remote
    exception itself when it travelled with the error, else the first line (Ray appends pages of
    advice and the remote traceback)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
