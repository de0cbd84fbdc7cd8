"""Issue 29's Qwen3-MoE end to end: `seer-run --sync` trains the untrained tiny Qwen3-MoE preset for
two iterations on two real vLLM instances sharing the Mooncake pool, with routing replay (R3) and a
KL reference model, in the trainer's default (tree) layout.

The schedule is forced as the KV-pool tests force it: the MoveEveryChunk test policy runs every
continuation chunk on the other instance, so chunks load their prefixes from the pool (or, back on
an instance that ran the request before, from its own prefix cache), and the prompts (longer than a
KV block) are shared by a group's samples through the prefix cache or the pool. Tokens an engine
loaded were not computed there, so their routing comes from the chunk that computed them (the
driver's join). The trainer writes the experts its routers used for every trained token
(trainer.routing_record_dir), which the test compares with the rollout's routing, token by token.
One run, several assertions (the suite's budget: two vLLM starts are most of its time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
MOVE = "seer.scheduler.policies.moving:MoveEveryChunk"
GROUPS, G = 2, 4
MISMATCH_MEAN, MISMATCH_MAX = 1e-5, 1e-3  # fp32 on both sides, the same experts for every token


@dataclass
class MoERun:
    run_dir: Path
    record_dir: Path
    log: str
    records: list[dict]


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory) -> MoERun:
    tmp = tmp_path_factory.mktemp("moe-r3")
    run_dir, record_dir = tmp / "run", tmp / "routing"
    sets = {"model.preset": "tiny-qwen3-moe", "task.loader": "tests.plugins_for_tests:long_prompts",
            "task.loader_args": json.dumps({"n": GROUPS * 2, "chars": 150}),
            "task.reward": "tests.plugins_for_tests:reward_by_checksum",
            "rollout.groups_per_iteration": GROUPS, "rollout.group_size": G, "rollout.max_tokens": 200,
            "scheduler.chunk_size": 64, "scheduler.policy": MOVE, "kvpool.capacity_bytes": 16 * 2**20,
            # one chunk at a time per instance: a group's later first chunks find its prompt computed
            "scheduler.max_running": 1,
            "trainer.routing_replay": "true", "trainer.kl_coef": 0.05, "trainer.lr": 1e-2,
            "trainer.routing_record_dir": str(record_dir)}
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "2", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=800)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return MoERun(run_dir, record_dir, log, records)


def test_moe_run_trains_in_the_tree_layout_with_weights_pushed_in_place_and_versions_checked(moe_run):
    recs = moe_run.records
    assert [r["iteration"] for r in recs] == [0, 1]
    assert [r["weight_versions"] for r in recs] == [[0], [1]]  # every rollout served the pushed version
    assert all(r["weight_sync_s"] > 0 for r in recs) and all(r["num_samples"] == GROUPS * G for r in recs)
    assert all(r["grad_norm"] > 0 and r["tree_token_ratio"] < 1 for r in recs)  # the tree shared the prompts
    for r in recs:  # vLLM's Qwen3-MoE and Megatron's compute the same log-probs on the replayed experts
        assert r["logprob_mismatch_mean"] < MISMATCH_MEAN and r["logprob_mismatch_max"] < MISMATCH_MAX, r
    # the reference model ran on the same (replayed) batches: the second mini-batch's KL after the first's update
    assert all(r["kl"] > 0 for r in recs)
    pushed = sorted((moe_run.run_dir / "weights").iterdir())
    assert pushed and json.loads((pushed[-1] / "config.json").read_text())["model_type"] == "qwen3_moe"


def test_routing_the_trainer_used_is_the_rollouts_for_every_token_of_moved_chunks_and_shared_prefixes(moe_run):
    for r in moe_run.records:
        # chunks moved, and loaded their prefixes from the pool; first chunks found their group's
        # prompt already computed (prefix cache or pool); the routing of those loaded tokens came from
        # the chunks that computed them (the driver's join)
        assert r["chunks_migrated"] > 0 and r["migrated_prefix_tokens_cached"] > 0, r
        assert r["prefix_tokens_cached"] > r["migrated_prefix_tokens_cached"], r
        assert r["routing"]["prefix_rows_loaded"] > 0, r["routing"]
    for version in (1, 2):
        rows = [json.loads(x) for x in (moe_run.record_dir / f"routing_used_{version:04d}_0.jsonl").read_text()
                .splitlines()]
        assert len(rows) == GROUPS * G and {row["batch_layout"] for row in rows} == {"tree"}
        for row in rows:
            n = len(row["prompt_ids"]) + len(row["response_ids"]) - 1  # every token whose output is read
            assert len(row["used"]) == len(row["rollout"]) == n
            assert row["used"] == row["rollout"]  # every token, every layer: the rollout's experts


def test_the_trainers_own_router_agrees_with_the_joined_routing(moe_run):
    """The differ metric is recorded; and since both sides compute in float32 (vLLM's capture equals
    transformers' router there: bench/results/routing), the trainer's own router, on the weights
    that sampled, picks the rollout's experts for (almost) every token: an independent check that
    the driver joined each loaded token's routing from the right computation (a misaligned or
    mismatched row would differ for most tokens: two random top-2 sets of 8 agree 1 time in 28)."""
    for r in moe_run.records:
        assert 0.0 <= r["moe_routing_differ_decisions"] <= r["moe_routing_differ_tokens"] <= 0.01, r
        assert r["moe_load_max"] >= 1.0 and len(r["moe_expert_load"]) == 2
