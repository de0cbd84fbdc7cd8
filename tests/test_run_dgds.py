"""`seer-run --sync --set dgds.enabled=true` end to end: the run launches its DGDS server, its
instances draft with the grouped proposer inside vLLM, and vLLM's own spec-decode counters show
accepted drafts: the iteration's `acceptance_length` (seer.rollout.stats.acceptance_length, from
the instances' counters at the start and end of the rollout) is above 1.

Greedy decoding (as tests/dgds/test_vllm_proposer.py): a group's siblings reproduce its probe, so
their drafts from the group's tree are accepted whatever the model; fixed draft lengths
(dgds.adaptive=false) so that the proposer drafts on every step. One iteration, no training.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_a_run_with_dgds_accepts_drafts_by_vllms_counters(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    sets = {"model.preset": "tiny", "task.num_prompts": 4, "rollout.groups_per_iteration": 4,
            "rollout.group_size": 4, "rollout.max_tokens": 128, "rollout.temperature": 0.0,
            "kvpool.enabled": "false", "dgds.enabled": "true", "dgds.adaptive": "false",
            "dgds.num_speculative_tokens": 4}
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--train", "off", "--iterations", "1", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    [rec] = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rec["num_samples"] == 16
    assert (run_dir / "dgds" / "dgds.log").exists()  # the run launched its own draft server
    accept = rec["acceptance_length"]
    print(f"\nDGDS in seer-run: acceptance length {accept} (vLLM's spec-decode counters)")
    assert accept is not None, "vLLM counted no drafts: the proposer never drafted"
    assert accept > 1.0, rec
