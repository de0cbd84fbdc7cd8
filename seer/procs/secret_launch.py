"""Run a Python module with secrets read from an inherited pipe, never from its exec environment.

`python -m seer.procs.secret_launch --secret-fd N -m MODULE ARGS...` (started by
seer.procs.GuardedProcess, never by hand). A process's /proc/<pid>/environ is the environment it
was exec'd with, for its whole life, and anyone who may read it (root; the same user while the
process is dumpable) reads every secret in it. So Seer hands a launched server its secrets (the
instances' VLLM_API_KEY, the draft server's SEER_DGDS_TOKEN) as JSON on a pipe: this launcher reads
them, makes itself non-dumpable (seer.procs.contain.protect), puts them in Python's `os.environ`
only (which the server's code reads), not in the C environment (no putenv), and runs MODULE as
`__main__` in this same process. A program it execs (multiprocessing's resource tracker, any
subprocess) inherits the C environment, so never a secret. vLLM's CPU platform starts its engine
core and workers with multiprocessing's `spawn` (an exec): every multiprocessing child's target is
wrapped (`_WithSecrets`), so the secrets travel in the pickled process object on multiprocessing's
own pipe, and the child protects itself and sets them the same way before its target runs (and
wraps its own children in turn). A forked child has them already.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Mapping

USAGE = "usage: python -m seer.procs.secret_launch --secret-fd N -m MODULE [ARGS...]"


def secret_pipe(secrets: Mapping[str, str]) -> int:
    """A pipe's read end holding `secrets` as JSON (the write end closed): pass it to the child
    (`pass_fds`), then close it here. At most 64 KiB (a pipe's buffer: written without blocking)."""
    data = json.dumps(dict(secrets)).encode()
    if len(data) > 65536:
        raise ValueError(f"secrets of {len(data)} bytes do not fit a pipe's buffer (64 KiB)")
    r, w = os.pipe()
    try:
        while data:
            data = data[os.write(w, data):]
    finally:
        os.close(w)
    return r


def read_secrets(fd: int) -> dict[str, str]:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    secrets = json.loads(b"".join(chunks) or b"{}")
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()):
        raise ValueError("the secrets on the pipe are not a JSON object of strings")
    return secrets


def in_python_only(secrets: Mapping[str, str]) -> None:
    """Set `secrets` in os.environ's mapping without putenv: os.environ.get and forked children see
    them, an exec'd program (which gets the C environment) does not."""
    for k, v in secrets.items():
        os.environ._data[os.environ.encodekey(k)] = os.environ.encodevalue(v)  # type: ignore[attr-defined]


class _WithSecrets:
    """A multiprocessing target that first makes its (possibly exec'd) process what this launcher made
    of its own: non-dumpable, the secrets in os.environ, its own children wrapped."""

    def __init__(self, target, secrets: dict[str, str]) -> None:
        self.target, self.secrets = target, secrets

    def __call__(self, *args, **kwargs):
        from seer.procs.contain import protect

        protect()
        in_python_only(self.secrets)
        pass_to_children(self.secrets)
        return self.target(*args, **kwargs)


def pass_to_children(secrets: Mapping[str, str]) -> None:
    """Wrap the target of every multiprocessing process this process starts from now on (`_WithSecrets`)."""
    from multiprocessing.process import BaseProcess

    if getattr(BaseProcess.start, "_seer_secrets", False):
        return
    start = BaseProcess.start

    def start_with_secrets(self):
        if self._target is not None and not isinstance(self._target, _WithSecrets):
            self._target = _WithSecrets(self._target, dict(secrets))
        return start(self)

    start_with_secrets._seer_secrets = True  # type: ignore[attr-defined]
    BaseProcess.start = start_with_secrets  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    from seer.procs.contain import protect

    if len(argv) < 4 or argv[0] != "--secret-fd" or not argv[1].isdigit() or argv[2] != "-m":
        print(USAGE, file=sys.stderr)
        return 2
    protect()  # before the secrets are in this process's memory for anyone to read
    secrets = read_secrets(int(argv[1]))
    in_python_only(secrets)
    pass_to_children(secrets)
    module = argv[3]
    sys.argv = [module, *argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    # the module under its own name, not __main__: _WithSecrets must pickle by an importable name
    from seer.procs.secret_launch import main as _main

    sys.exit(_main(sys.argv[1:]))
