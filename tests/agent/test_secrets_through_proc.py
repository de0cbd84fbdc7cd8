"""An agent reads no secret of the run through /proc (issue 36, item 4), on real processes.

A driver as seer-run is one (tests.agent.proc_driver) starts with a marker and a WANDB_API_KEY in its
exec environment, as a user's shell would hand them, launches the draft server with a run secret and
runs an agent that tries every /proc route to every process it can see (tests.agent.proc_probe), and
reads Ray's token file, as a function agent, as a command agent and as a served command agent (agent.serve). Monkeypatched variables never reach /proc, so the secrets
here are in real exec environments and real memory.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

REFUSED = {"EACCES", "EPERM"}


def test_an_agent_reads_no_secret_of_the_driver_or_the_draft_server_through_proc_nor_rays_token(tmp_path: Path):
    marker, wandb = f"marker-{secrets.token_hex(16)}", f"wandb-{secrets.token_hex(16)}"
    env = {**os.environ, "SEER_TEST_DRIVER_MARKER": marker, "WANDB_API_KEY": wandb}
    done = subprocess.run([sys.executable, "-m", "tests.agent.proc_driver", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    driver = json.loads((tmp_path / "driver.json").read_text())
    token = driver["dgds_token"]
    assert token and len(token) >= 40
    for kind in ("function", "command", "served"):
        assert driver["sessions"][kind] == {"reward": 1.0, "error": None}, (kind, driver["sessions"][kind])
        report = json.loads((tmp_path / f"{kind}.json").read_text())
        assert report["can"] == {"read_own_source": True, "tmp_file": True, "loopback": True}, (kind, report["can"])
        assert int(report["caps"]["CapEff"], 16) == 0 and int(report["caps"]["CapBnd"], 16) == 0, report["caps"]
        # the probe works: it reads what /proc shows anyone (the driver's command line) and its own environment
        answers = report["answers"]
        assert answers[str(driver["pid"])]["cmdline"] == "read", answers.get(str(driver["pid"]))
        assert "PATH=" in report["own"]["proc_environ"] and (kind == "command") == ("SEER_SESSION_ID=" in report["own"]["proc_environ"])
        # ... and nothing of the driver's or the draft server's beyond that
        assert len(driver["dgds_holders"]) == 1, driver  # the server (the launcher running seer.dgds.server.cli)
        for pid in (driver["pid"], *driver["dgds_holders"]):
            routes = answers.get(str(pid))
            assert routes is not None, f"the agent did not see process {pid}"
            for route in ("environ", "mem", "maps", "fd", "auxv"):
                assert routes[route] in REFUSED, (kind, pid, route, routes)
        # Ray's token: a file of the run's user, hidden from agents (their own mount namespace)
        assert answers[driver["ray_token_path"]]["read"] in REFUSED | {"ENOENT"}, answers[driver["ray_token_path"]]
        everything = "\n".join([*report["got"], *report["own"].values()])
        found = [name for name, value in (("driver marker", marker), ("WANDB_API_KEY", wandb), ("DGDS token", token),
                                          ("Ray's token", driver["ray_token"])) if value in everything]
        assert not found, f"the {kind} agent read {found} through /proc or its environment"


TARGET = """
import ctypes, sys, time
from seer.procs.contain import contain_agent, protect
contain_agent()  # no capability left, as a non-root user's processes have none
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE back on: what an unprotected process is
if sys.argv[1] == "protected":
    protect()
print("up", flush=True)
time.sleep(60)
"""


def test_a_protected_process_is_unreadable_to_a_capless_process_of_its_user_even_with_no_capability_itself():
    """What a non-root user's run relies on (no capability anywhere, so only seer.procs.contain.protect
    stands between an agent and /proc/<driver>/environ): the capless probe reads the unprotected
    process's environment and memory, and none of the protected one's."""
    from tests.agent.proc_probe import _route

    marker = f"marker-{secrets.token_hex(16)}"
    env = {**os.environ, "SEER_TEST_TARGET_MARKER": marker}
    targets = {how: subprocess.Popen([sys.executable, "-c", TARGET, how], env=env, stdout=subprocess.PIPE, text=True)
               for how in ("dumpable", "protected")}
    try:
        for p in targets.values():
            assert p.stdout.readline() == "up\n"
        probe = ("import json, sys\nfrom seer.procs.contain import contain_agent\nfrom tests.agent.proc_probe import _route\n"
                 "contain_agent()\nout = {}\nfor pid in sys.argv[1:]:\n    for route in ('environ', 'mem'):\n"
                 "        try:\n            out[pid + route] = _route(int(pid), route).decode('latin-1')\n"
                 "        except OSError as e:\n            out[pid + route] = e.strerror\nprint(json.dumps(out))\n")
        done = subprocess.run([sys.executable, "-c", probe, *(str(p.pid) for p in targets.values())],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        open_pid, shut_pid = str(targets["dumpable"].pid), str(targets["protected"].pid)
        assert marker in got[open_pid + "environ"] and marker in got[open_pid + "mem"]  # the probe works
        assert got[shut_pid + "environ"] in ("Permission denied", "Operation not permitted"), got[shut_pid + "environ"][:300]
        assert got[shut_pid + "mem"] in ("Permission denied", "Operation not permitted"), got[shut_pid + "mem"][:300]
        assert _route(int(shut_pid), "environ")  # root with its capabilities (this test) still reads it
    finally:
        for p in targets.values():
            p.kill()
            p.wait()
