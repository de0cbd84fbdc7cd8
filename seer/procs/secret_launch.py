"""Run a Python module with secrets read from an inherited pipe, never from its exec environment.

`python -m seer.procs.secret_launch --secret-fd N -m MODULE ARGS...` (started by
seer.procs.GuardedProcess, never by hand). A process's /proc/<pid>/environ is the environment it
was exec'd with, for its whole life, and anyone who may read it (root; the same user while the
process is dumpable) reads every secret in it. So Seer hands a launched server its secrets (the
instances' VLLM_API_KEY, the draft server's SEER_DGDS_TOKEN) as JSON on a pipe: this launcher reads
them, makes itself non-dumpable (seer.procs.contain.protect), puts them in `os.environ` (which the
server's code reads, and which changes no /proc file) and runs MODULE as `__main__` in this same
process. Its forked children (vLLM's engine core) inherit both; a child it exec'd would carry them
in its own environment, which tests/fleet/test_fleet.py checks never happens.
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


def main(argv: list[str]) -> int:
    from seer.procs.contain import protect

    if len(argv) < 4 or argv[0] != "--secret-fd" or not argv[1].isdigit() or argv[2] != "-m":
        print(USAGE, file=sys.stderr)
        return 2
    protect()  # before the secrets are in this process's memory for anyone to read
    secrets = read_secrets(int(argv[1]))
    os.environ.update(secrets)
    module = argv[3]
    sys.argv = [module, *argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
