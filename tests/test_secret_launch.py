"""seer.procs.secret_launch on real processes: a secret handed to a launched process reaches its
Python code (and a multiprocessing `spawn` child's, as vLLM's CPU engine core is started), never an
exec environment or command line that /proc shows, and every process holding it is non-dumpable."""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

import pytest

from seer.procs import GuardedProcess


def test_a_secret_reaches_the_launched_code_and_its_spawned_child_but_no_exec_environment(tmp_path: Path):
    name, value = "SEER_DGDS_TOKEN", secrets.token_urlsafe(32)
    out = tmp_path / "seen.json"
    proc = GuardedProcess("target", [sys.executable, "-m", "tests.secret_launch_target", str(out), name],
                          tmp_path / "target.log", secrets={name: value})
    proc.start()
    deadline = time.monotonic() + 120
    while proc.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.returncode == 0, proc.log_tail()
    seen = json.loads(out.read_text())
    assert seen["argv"][1:] == [str(out), name]  # the module ran with its own arguments
    for who in ("launcher", "spawned"):
        assert seen[who] == {"os_environ": value, "proc_environ": False, "dumpable": 0}, (who, seen[who])
    assert seen["subprocess"] == ["[]", "0"]  # an exec'd program: neither in its environment nor its /proc
    assert value not in (tmp_path / "target.log").read_text()


def test_secrets_reach_only_a_python_module_command(tmp_path: Path):
    with pytest.raises(ValueError, match="python -m MODULE"):
        GuardedProcess("x", ["mooncake_master", "--port", "1"], tmp_path / "x.log", secrets={"A": "b"})
