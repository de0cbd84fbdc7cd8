"""`seer-run --sync` with two data-parallel trainer ranks loses one (SIGKILL of its Ray worker)
after iteration 0 is committed: the job stops within RANK_LOSS_EXIT_S with an error that names the
rank, keeps what it committed, and `--resume` finishes the run at the same world size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ITERATIONS = 3
RANK_LOSS_EXIT_S = 60.0  # the next train step fails at once (Ray reports the dead actor), then shutdown


def _cmd(run_dir, urls) -> list[str]:
    sets = {"instances.urls": "[" + ",".join(urls) + "]", "model.preset": "tiny", "task.num_prompts": 8,
            "rollout.groups_per_iteration": 2, "rollout.group_size": 4, "rollout.max_tokens": 64,
            "kvpool.enabled": "false", "train.checkpoint_every": 1, "trainer.lr": 1e-4,
            "trainer.data_parallel": 2}
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", str(ITERATIONS), "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def _ranks(root: int) -> list[int]:
    """The job's trainer rank workers: Ray titles them `ray::TrainerRank...`."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes().startswith(b"ray::TrainerRank") and _descends(int(d.name), root):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def _descends(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def test_a_lost_trainer_rank_stops_the_run_and_resume_finishes_it(vllm_pool, restore_base_weights, tmp_path):
    urls = [c.base_url for c in vllm_pool.clients]
    run_dir, log = tmp_path / "run", tmp_path / "first.log"
    first = subprocess.Popen(_cmd(run_dir, urls), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not list(run_dir.glob("checkpoints/iter_0000/loop_state.json")):
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ranks = _ranks(first.pid)
        assert len(ranks) == 2, ranks
        os.kill(max(ranks), signal.SIGKILL)
        killed_at = time.monotonic()
        rc = first.wait(timeout=300)
        took = time.monotonic() - killed_at
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    out = log.read_text()
    assert rc == 1, out[-3000:]
    assert took < RANK_LOSS_EXIT_S, took
    assert "trainer rank" in out and "--resume" in out, out[-3000:]
    done = sorted(int(p.parent.name.split("_")[1]) for p in run_dir.glob("checkpoints/iter_*/loop_state.json"))
    assert done and done[-1] < ITERATIONS - 1

    r = subprocess.run(_cmd(run_dir, urls) + ["--resume"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in recs] == list(range(ITERATIONS))
    assert [x["weight_version"] for x in recs] == list(range(ITERATIONS))
