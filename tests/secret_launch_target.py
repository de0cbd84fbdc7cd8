"""A server stand-in for tests/test_secret_launch.py: `python -m tests.secret_launch_target OUT NAME`,
run by GuardedProcess with the secret NAME. Reports what it, a multiprocessing `spawn` child (as vLLM's
CPU engine core is started) and a plain subprocess see of the secret, to OUT as JSON."""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path


def seen(name: str) -> dict:
    return {"os_environ": os.environ.get(name), "proc_environ": name.encode() in Path("/proc/self/environ").read_bytes(),
            "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)}  # PR_GET_DUMPABLE


def child(name: str, out: str) -> None:
    Path(out).write_text(json.dumps(seen(name)))


def main(out: str, name: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=child, args=(name, out + ".spawned"))
    p.start()
    p.join()
    shell = subprocess.run(["sh", "-c", f'echo "[${name}]"; tr "\\0" "\\n" < /proc/self/environ | grep -c "^{name}=" || true'],
                           capture_output=True, text=True).stdout.split()
    Path(out).write_text(json.dumps({"launcher": seen(name), "spawned": json.loads(Path(out + ".spawned").read_text()),
                                     "subprocess": shell, "argv": sys.argv}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
