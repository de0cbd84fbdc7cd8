"""Kill `seer-run --sync` mid-run (SIGKILL, no clean-up), then `--resume`.

The resumed job must continue after the last checkpoint with the same data order, apply every
update exactly once (the optimizer's step count proves it) and skip no iteration; every sample
carries the weight version of the iteration that produced it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from seer.tasks import iteration_prompts

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ITERATIONS = 3
PROMPTS = 16
GROUPS = 4


def _cmd(run_dir, urls) -> list[str]:
    sets = {
        "instances.urls": "[" + ",".join(urls) + "]",
        "model.preset": "tiny", "task.num_prompts": PROMPTS, "rollout.groups_per_iteration": GROUPS,
        "rollout.group_size": 4, "rollout.max_tokens": 128, "kvpool.enabled": "false",
        "train.checkpoint_every": 1, "train.keep_checkpoints": 5, "trainer.lr": 1e-4, "trainer.mini_batches": 1,
    }
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", str(ITERATIONS), "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def _checkpoints(run_dir) -> list[int]:
    return sorted(int(p.parent.name.split("_")[1]) for p in run_dir.glob("checkpoints/iter_*/loop_state.json"))


def test_killed_run_resumes_from_its_last_checkpoint(vllm_pool, restore_base_weights, tmp_path):
    """On the session's running instances (seer-run attaches by URL): the killed job leaves them
    serving version 1 or 2, and the resumed job loads its checkpoint's weights into them first."""
    import torch

    urls = [c.base_url for c in vllm_pool.clients]

    run_dir = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(_cmd(run_dir, urls), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        try:
            while not _checkpoints(run_dir):  # iteration 0 trained and checkpointed: kill inside iteration 1
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint within 600 s"
                time.sleep(0.05)
        finally:
            first.kill()
            first.wait()
    done_before = _checkpoints(run_dir)[-1]
    assert done_before < ITERATIONS - 1, "the run finished before it could be killed"
    # Every checkpointed iteration has its record (written before the checkpoint); a later one may too.
    before = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][: done_before + 1]
    assert [r["iteration"] for r in before] == list(range(done_before + 1))

    r = subprocess.run(_cmd(run_dir, urls) + ["--resume"], capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"resuming after iteration {done_before}" in r.stdout

    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in recs] == list(range(ITERATIONS))  # none skipped, none twice
    assert [x["weight_version"] for x in recs] == list(range(ITERATIONS))
    assert recs[: done_before + 1] == before  # what was done before the kill is kept as it was

    for it in range(ITERATIONS):  # same data order as an uninterrupted run; on-policy samples
        samples = [json.loads(x) for x in (run_dir / "rollouts" / f"iter_{it:04d}.jsonl").read_text().splitlines()]
        assert {s["prompt_index"] for s in samples} == set(iteration_prompts(list(range(PROMPTS)), it, GROUPS))
        assert {s["weight_version"] for s in samples} == {it}

    last = run_dir / "checkpoints" / f"iter_{ITERATIONS - 1:04d}"
    assert json.loads((last / "loop_state.json").read_text())["weight_version"] == ITERATIONS
    state = torch.load(last / "trainer_state.pt", map_location="cpu", weights_only=False)
    assert state["iteration"] == ITERATIONS
    steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {float(ITERATIONS)}  # one optimizer step per iteration: no update applied twice
