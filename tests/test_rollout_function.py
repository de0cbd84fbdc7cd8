"""`rollout.function`: a rollout function given by path runs through `seer-run` unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from seer.rollout.base import RolloutContext, RolloutRequest
from seer.rollout.single_turn import single_turn_rollout

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


async def tagged_rollout(ctx: RolloutContext, req: RolloutRequest):
    """The default rollout, then marks what it returned, so the test can see the loop used its batch."""
    batch = await single_turn_rollout(ctx, req)
    for s in batch.samples:
        s.turns = 3
    batch.stats.extra["rollout_function"] = f"tagged, {len(ctx.backends)} backends, version {req.weight_version}"
    return batch


def test_a_rollout_function_by_path_runs_through_seer_run(vllm_pool, tmp_path):
    urls = "[" + ",".join(c.base_url for c in vllm_pool.clients) + "]"
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "seer.cli", "--sync", "--train", "off", "--iterations", "1", "--run-dir", str(run_dir),
         "--set", "model.preset=tiny", "--set", f"instances.urls={urls}", "--set", "task.num_prompts=3",
         "--set", "rollout.groups_per_iteration=3", "--set", "rollout.group_size=2", "--set", "rollout.max_tokens=32",
         "--set", "rollout.function=tests.test_rollout_function:tagged_rollout"],
        capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = json.loads((run_dir / "metrics.jsonl").read_text())
    assert rec["rollout_function"] == f"tagged, {len(vllm_pool.clients)} backends, version 0"
    samples = [json.loads(x) for x in (run_dir / "rollouts" / "iter_0000.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and {s["turns"] for s in samples} == {3}
