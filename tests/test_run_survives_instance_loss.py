"""`seer-run --sync` loses a vLLM instance (SIGKILL) after its first iteration: whether the kill lands
in a rollout, in training or in a weight update, the job drops the instance, says so, and finishes
every iteration with full batches on the survivor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from seer.procs.process import _children

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def _vllm_guards(pid: int) -> list[int]:
    """The job's guard processes that run a vLLM server."""
    out = []
    for child in _children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "seer.procs.guard" in cmd and "vllm.entrypoints" in cmd:
            out.append(child)
    return out


def _running(guard: int) -> int:
    """Requests the guard's vLLM server is running now (its /metrics)."""
    from seer.fleet.telemetry import telemetry_from_metrics

    argv = Path(f"/proc/{guard}/cmdline").read_bytes().decode().split("\0")
    port = argv[argv.index("--port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return telemetry_from_metrics("victim", r.read().decode()).num_running


@pytest.mark.parametrize("phase", ["rollout", "training"])
def test_run_drops_a_killed_instance_and_finishes(tiny_model, tmp_path, phase):
    """`rollout`: killed while it runs iteration 1's first chunks (they move); `training`: killed once
    iteration 1's samples are saved, so the weight update finds it dead."""
    run_dir = tmp_path / "run"
    sets = {"model.preset": "tiny", "task.num_prompts": 8, "rollout.groups_per_iteration": 4,
            "rollout.group_size": 4, "rollout.max_tokens": 128, "kvpool.enabled": "false", "trainer.lr": 1e-4}
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "3", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            metrics = run_dir / "metrics.jsonl"
            # iteration 0's checkpoint is the last thing written before iteration 1's rollout
            marker = (run_dir / "checkpoints" / "iter_0000" / "loop_state.json" if phase == "rollout"
                      else run_dir / "rollouts" / "iter_0001.jsonl")
            deadline = time.monotonic() + 600
            while not (marker.exists() and marker.read_text().strip()):
                assert job.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.1)
            guards = _vllm_guards(job.pid)
            assert len(guards) == 2
            if phase == "rollout":  # nothing is generated between the checkpoint and the rollout
                while _running(guards[-1]) == 0:
                    assert job.poll() is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, "iteration 1's rollout never reached the instance"
                    time.sleep(0.02)
            for server in _children(guards[-1]):  # the vLLM server leads its own process group
                os.killpg(server, signal.SIGKILL)
            assert job.wait(timeout=600) == 0, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                job.kill()
    text = log.read_text()
    assert ("dropped from the rollout" if phase == "rollout" else "not answering during the weight update") in text
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1, 2]
    assert all(r["num_samples"] == 16 for r in recs)  # no sample lost
    assert len(recs[-1]["instances"]) == 1  # the last iteration ran on the survivor alone
    assert [r["weight_version"] for r in recs] == [0, 1, 2]
