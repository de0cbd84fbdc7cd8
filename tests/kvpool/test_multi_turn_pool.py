"""Issue 19: a three-turn trajectory whose every turn runs on another instance than the one before
loads its history from the Mooncake pool (vLLM's external-cache counters show it) and produces the
same greedy tokens as an uninterrupted session."""

from __future__ import annotations

import asyncio

import pytest

from seer.kvpool import BLOCK_TOKENS
from seer.rollout.base import RolloutContext, RolloutRequest
from seer.rollout.multi_turn import multi_turn_rollout
from seer.scheduler import SchedulerConfig
from seer.tasks.env import EnvConfig, EnvRunner
from seer.tasks.reward import RewardRunner
from seer.types import GenerateRequest, PromptSpec, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def test_turns_on_other_instances_load_the_history_from_the_pool(rig):
    from transformers import AutoTokenizer

    from seer.fleet.measure import counters
    from seer.kvpool.accounting import usage_between

    tok = AutoTokenizer.from_pretrained(rig.model)
    text = "Take away 1-9 at a time until nothing is left.\n" * 3 + "Take away 1-9 at a time until nothing is left.\nstart=0041\n"
    prompt = PromptSpec(0, text, list(tok(text)["input_ids"]), {})
    assert len(prompt.prompt_ids) > BLOCK_TOKENS
    obs = tuple(tok("=0030\n", add_special_tokens=False)["input_ids"])
    env = EnvRunner("tests.multiturn.envs_for_tests:ScriptEnv", EnvConfig(stop=("\n",), max_turn_tokens=24, workers=1),
                    {"obs": obs, "turns": 3})
    clients = rig.instances.clients
    ctx = RolloutContext(
        clients, SchedulerConfig(policy="seer.scheduler.policies.moving:MoveEveryChunk", chunk_size=32),
        RewardRunner("seer.tasks.env:zero_reward"), env=env,
        decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
        encode=lambda t: list(tok(t, add_special_tokens=False)["input_ids"]))

    async def greedy(ids, n, rid):
        r = await clients[0].generate(GenerateRequest(rid, ids, n, SamplingParams(temperature=0.0)))
        return r.token_ids

    async def go():
        try:
            before = [await counters(c) for c in clients]
            batch = await multi_turn_rollout(ctx, RolloutRequest(0, [prompt], 1, SamplingParams(temperature=0.0, max_tokens=200)))
            await asyncio.sleep(0.5)
            after = [await counters(c) for c in clients]
            s = batch.samples[0]
            # the uninterrupted session: each turn generated in one request from the whole history
            history, ref, k = list(prompt.prompt_ids), [], 0
            for turn in range(3):
                n = next(i for i in range(k, len(s.loss_mask) + 1) if i == len(s.loss_mask) or s.loss_mask[i] == 0) - k
                ref_turn = await greedy(history, n, f"mtpool-ref-{turn}")
                ref += ref_turn
                history += ref_turn
                k += n
                if turn < 2:
                    ref += list(obs)
                    history += list(obs)
                    k += len(obs)
            return batch, [usage_between(b, a) for b, a in zip(before, after)], ref
        finally:
            for c in clients:
                await c.close()

    try:
        batch, usage, ref = asyncio.run(go())
    finally:
        env.close()
    s = batch.samples[0]
    assert s.turns == 3 and s.response_ids == ref
    turn_chunks = {}
    for c in batch.chunks:
        turn_chunks.setdefault(c.turn, []).append(c)
    assert set(turn_chunks) == {0, 1, 2}
    first_of = [turn_chunks[t][0] for t in (1, 2)]
    assert all(c.migrated for c in first_of)  # turns 2 and 3 each began on another instance
    assert all(c.instance != turn_chunks[t - 1][-1].instance for t, c in zip((1, 2), first_of))
    # turn 2's instance had never seen this trajectory: its history's full blocks came from the pool
    turn2 = first_of[0]
    assert turn2.cached_prefix_tokens >= (turn2.prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS > 0, turn2
    by_name = dict(zip([c.name for c in clients], usage))
    assert by_name[turn2.instance].tokens_from_pool >= turn2.cached_prefix_tokens, usage
    assert first_of[1].cached_prefix_tokens >= BLOCK_TOKENS  # turn 3, back on the first: cached there or in the pool
