"""The multi-turn comparison's baselines on real vLLM instances of the tiny model (bench.multiturn_compare):
session-sticky routing keeps every turn of a trajectory on its first instance (which then finds the
history in its prefix cache), and APRIL's carry-over counts exactly the kept tokens generated in an
earlier iteration."""

from __future__ import annotations

import asyncio

import pytest

from bench.multiturn_compare import BY_NAME, MTSettings, Trajectory, one_iteration, run_april
from seer.sim.scripts import Script
from seer.types import PromptSpec

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

BLOCK = 128  # vLLM's CPU backend: only full blocks are cached
OBS = (61, 62, 63, 10)


def _prompt(index: int, n: int = 150) -> PromptSpec:
    return PromptSpec(index, f"p{index}", [40 + (index + i) % 50 for i in range(n)], {})


def _script(turn_tokens: int, turns: int, latency_s: float) -> Script:
    return Script((turn_tokens,) * turns, ((),) + (OBS,) * (turns - 1), (0.0,) + (latency_s,) * (turns - 1))


def _settings(**kw) -> MTSettings:
    return MTSettings(**{"max_tokens": 256, "chunk_size": 16, "max_num_seqs": 128, "temperature": 0.0,
                         "configs": "sticky,april", **kw})


def _run(vllm_pool, coro_fn):
    async def go():
        try:
            return await coro_fn(vllm_pool.clients)
        finally:
            for c in vllm_pool.clients:
                await c.close()

    return asyncio.run(go())


def test_session_sticky_keeps_every_turn_on_its_first_instance(vllm_pool, tiny_model):
    from seer.kvpool.accounting import kv_bytes_per_token

    s = _settings()
    issued = [(_prompt(g), [_script(6, 3, 0.05) for _ in range(2)]) for g in range(3)]
    result, _ = _run(vllm_pool, lambda clients: one_iteration(
        clients, BY_NAME["sticky"], s, issued, 2, "stk-", kv_bytes_per_token(tiny_model)))
    assert len(result.samples) == 6 and all(x.turns == 3 for x in result.samples)
    by_request: dict[str, list] = {}
    for c in result.chunks:
        by_request.setdefault(c.request_id, []).append(c)
    for rid, cs in by_request.items():
        assert len({c.instance for c in cs}) == 1, (rid, [(c.turn, c.instance) for c in cs])
        assert [c.turn for c in cs] == [0, 1, 2]  # one engine request per turn
        assert all(c.cached_prefix_tokens >= BLOCK for c in cs[1:]), cs  # the history from its own prefix cache
    assert len({cs[0].instance for cs in by_request.values()}) == 2  # first turns spread by load
    assert result.policy_summary["routes"] == {"first": 6, "sticky": 12, "rehome": 0}
    assert len(result.env_waits) == 6 * 4  # per trajectory: the reset, two tool calls, the final answer
    assert all(w.instance is not None for w in result.env_waits if w.turn > 0)


def test_april_carries_the_unfinished_group_and_counts_its_earlier_tokens_as_off_policy(vllm_pool, tiny_model):
    from seer.kvpool.accounting import kv_bytes_per_token

    s = _settings(groups=1, group_size=2, iterations=2, over_issue=1.0)  # issue 2 groups, keep 1
    # it 0: groups 0 and 1, group 0 done first (kept) while group 1 is past its first turn (carried);
    # it 1: the carried group 1 and a fresh group 2, group 1 done first (kept)
    short, long_, longer = _script(4, 2, 0.5), _script(8, 4, 0.4), _script(8, 4, 0.8)
    plan = {0: short, 1: long_, 2: longer}
    prompts = [_prompt(g) for g in plan]
    trajs = {(g, k): Trajectory(g, k, tuple(prompts[g].prompt_ids), sc) for g, sc in plan.items() for k in range(2)}
    runs = _run(vllm_pool, lambda clients: run_april(
        clients, BY_NAME["april"], s, trajs, prompts, 0, 0, kv_bytes_per_token(tiny_model), {}, lambda m: None))
    first, second = (r.stats for r in runs)
    a0, a1 = first["april"], second["april"]
    assert (a0["kept_groups"], a0["fresh_groups"], a0["issued_trajectories"]) == (1, 2, 4)
    assert (a0["kept_model_tokens"], a0["off_policy_tokens"]) == (2 * short.model_tokens, 0)  # all on-policy
    assert a0["carried_unfinished"] == 2
    # iteration 1: the carried group 1 and one fresh group; group 1 finishes first and is kept
    assert (a1["fresh_groups"], a1["issued_trajectories"], a1["kept_groups"]) == (1, 4, 1)
    assert a1["kept_model_tokens"] == 2 * long_.model_tokens
    earlier = first["model_tokens"] - 2 * short.model_tokens  # what group 1 generated in iteration 0
    assert 0 < earlier < a1["kept_model_tokens"]
    assert a1["off_policy_tokens"] == earlier
    assert a1["off_policy_share"] == pytest.approx(earlier / a1["kept_model_tokens"])
    assert a1["max_age_iterations"] == 1 and a1["trajectories_with_earlier_tokens"] == 2
    # the carried sessions went back to their engines; only the fresh group's were placed anew
    assert second["policy_summary"]["routes"]["first"] == 2 and second["policy_summary"]["routes"]["rehome"] == 0
