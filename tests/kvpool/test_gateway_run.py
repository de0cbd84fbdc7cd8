"""Issue 30: `seer-run --sync` trains two iterations of agents with function tools through the
gateway, on real vLLM instances sharing the Mooncake pool. `task.agent` is one module:function
(tests.gateway.agents_for_tests:run_agent) that serves the three kinds of agent, by session: s0 and
s1 an `openai`-client loop, s2 an OpenAI Agents SDK agent, s3 a command-line program run by the
runner's own command mode (seer.rollout.agents: agent host, session environment, reward file, process
group), as a `task.agent` command line is. One run, several claims:

- the trainer's sequences are exactly the instances' tokens: every loss-mask-1 token is a token an
  instance returned at exactly that context, with its log-prob; every mask-0 token is one the gateway
  appended (template, tool, user text), never one the model wrote;
- a session that edits its history (sessions s1) is trained as its two leaves (Sample.branch);
- turns of one session run on other instances (a test policy moves every chunk) and load the
  session's history from the pool (vLLM's external-cache counters)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def trainer_sequences(samples: list[dict]) -> list[dict]:
    """What the trainer makes of the recorded samples: its own `sequences_from_batch`."""
    from types import SimpleNamespace

    from seer.trainer.algorithms import Algorithms
    from seer.trainer.config import TrainerConfig
    from seer.trainer.trainer import Trainer
    from seer.types import Branch, PromptSpec, RolloutBatch, Sample

    batch = RolloutBatch([Sample(s["group_id"], s["sample_index"], s["request_id"], PromptSpec(0, "", s["prompt_ids"], {}),
                                 s["response_ids"], s["logprobs"], "stop", 0.0, 0.0, s["instances"], reward=s["reward"],
                                 loss_mask=s["loss_mask"], branch=Branch(s["session"], tuple(s["path"])))
                          for s in samples], None)
    cfg = TrainerConfig()
    seqs = Trainer.sequences_from_batch(SimpleNamespace(config=cfg, algorithms=Algorithms.from_config(cfg)), batch)
    return [{"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "loss_mask": t.loss_mask,
             "rollout_logprobs": t.rollout_logprobs, "advantage": t.advantage} for t in seqs]


def test_seer_run_trains_a_gateway_agent_token_exact_with_branches_and_turns_moved_through_the_pool(rig, tmp_path):
    from seer.fleet.measure import counters
    from seer.fleet.weights import push_weights
    from seer.kvpool.accounting import usage_between

    clients = rig.instances.clients
    urls = "[" + ",".join(c.base_url for c in clients) + "]"
    run_dir, record = tmp_path / "run", tmp_path / "record"

    async def read():
        try:
            return [await counters(c) for c in clients]
        finally:
            for c in clients:
                await c.close()

    before = asyncio.run(read())
    try:
        r = subprocess.run(
            [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "2", "--run-dir", str(run_dir),
             "--set", "task.name=calculator", "--set", "model.preset=tiny", "--set", f"instances.urls={urls}",
             "--set", "task.agent=tests.gateway.agents_for_tests:run_agent",
             "--set", "rollout.function=tests.gateway.recording_rollout:recording_gateway_rollout",
             "--set", "task.num_prompts=2", "--set", "rollout.groups_per_iteration=1", "--set", "rollout.group_size=4",
             "--set", "rollout.max_tokens=16", "--set", "scheduler.chunk_size=4",
             "--set", "scheduler.policy=seer.scheduler.policies.moving:MoveEveryChunk"],
            capture_output=True, text=True, timeout=500, env={**os.environ, "SEER_GATEWAY_RECORD": str(record)})
        after = asyncio.run(read())
    finally:
        async def restore():
            try:
                await push_weights(clients, str(rig.model), 0)
            finally:
                for c in clients:
                    await c.close()
        asyncio.run(restore())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and recs[1]["weight_version"] == 1

    for it in range(2):
        rec = json.loads((record / f"iter_{it}.json").read_text())
        generated: dict[tuple, tuple[int, float]] = {}  # (context, token) -> log-prob, per instance output
        for c in rec["chunks"]:
            for i, (t, lp) in enumerate(zip(c["out"], c["lp"])):
                generated[(tuple(c["prompt"]) + tuple(c["out"][:i]), t)] = lp
        samples = sorted(rec["samples"], key=lambda s: (s["group_id"], s["sample_index"]))  # the trainer's order
        train = trainer_sequences(samples)
        assert len(train) == len(samples) == 5  # 4 sessions, one branched: 5 leaves
        for s, t in zip(samples, train, strict=True):
            full = s["prompt_ids"] + s["response_ids"]
            assert t["prompt_ids"] + t["response_ids"] == full and t["loss_mask"] == s["loss_mask"]
            mask = [0] * len(s["prompt_ids"]) + s["loss_mask"]
            model = [(p, full[p]) for p, m in enumerate(mask) if m]
            assert model and s["loss_mask"][0] == 1  # the prompt is everything before the model's first token
            for p, tok in model:  # generated by an instance at exactly this context, with this log-prob
                assert generated.get((tuple(full[:p]), tok)) is not None, (s["request_id"], p)
            assert [generated[(tuple(full[:p]), tok)] for p, tok in model] == s["logprobs"]
            assert [x for x, m in zip(t["rollout_logprobs"], s["loss_mask"]) if m] == s["logprobs"]
        branched = [s for s in samples if s["session"].endswith("-s1")]
        assert len(branched) == 2 and branched[0]["path"] == [0, 1] and branched[1]["path"] == [2]  # call 0 dropped
        assert len({t["advantage"] for t, s in zip(train, samples) if s["session"].endswith("-s1")}) == 1
        assert rec["extra"]["gateway_branches"] == 1 and rec["extra"]["agent_errors"] == 0
        by_kind = {s["session"].rsplit("-", 1)[1]: s for s in samples if s["request_id"] == s["session"]}  # finals
        assert by_kind["s0"]["path"] == [0, 1, 2] and by_kind["s3"]["path"] == [0, 1, 2]  # openai loop, command line
        sdk_calls = len(by_kind["s2"]["path"])
        assert sdk_calls >= 2 and by_kind["s2"]["path"] == list(range(sdk_calls))  # the SDK's two runs, one session
        assert rec["extra"]["gateway_calls"] == 9 + sdk_calls
        moved = {tuple(s["instances"]) for s in samples}
        assert all(len(set(i)) == 2 for i in moved)  # every session ran on both instances
    assert recs[0]["chunks_migrated"] > 0
    usage = [usage_between(b, a, rig.kv_bytes_per_token) for b, a in zip(before, after)]
    assert sum(u.tokens_from_pool for u in usage) >= 128, usage  # moved turns loaded their history from the pool
