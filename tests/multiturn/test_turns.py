"""Multi-turn requests on the scheduler, against an in-process scripted engine (no vLLM): turns cut
at stop sequences across chunk boundaries, observations appended with loss mask 0, no slot held
while the environment works."""

from __future__ import annotations

import asyncio
import time

import pytest

from seer.scheduler import RolloutDriver, SchedulerConfig
from seer.scheduler.turns import StopMatcher, TurnCut, TurnEnd, TurnReply
from seer.types import GenerateRequest, GenerateResult, PromptSpec, SamplingParams, Telemetry

PATTERN = [ord(c) for c in "xy</c>"]  # the engine writes this forever; "</c>" ends each turn


def prompts(n: int, prompt_len: int = 4) -> list[PromptSpec]:
    return [PromptSpec(i, f"p{i}", [100 + i] * prompt_len, {}) for i in range(n)]


def decode(ids):
    return "".join(chr(i) for i in ids)


def test_a_stop_sequence_split_across_chunks_ends_the_turn_where_it_ends():
    m = StopMatcher(["</c>"], decode)
    assert m.cut([ord(c) for c in "ab</"], [ord(c) for c in "c>zz"], "length") == TurnCut(2, "stop_sequence")
    assert m.cut([ord(c) for c in "ab"], [ord(c) for c in "</c"], "length") is None
    assert m.cut([], [ord(c) for c in "ab"], "stop") == TurnCut(2, "eos")
    assert StopMatcher([], decode, max_turn_tokens=5).cut([1, 2, 3], [4, 5, 6], "length") == TurnCut(2, "turn_length")


class ScriptedEngine:
    """Writes PATTERN by absolute position; records how many of our chunks ran at once."""

    def __init__(self, name: str):
        self.name = name
        self.running = 0
        self.requests: list[GenerateRequest] = []

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        self.requests.append(req)
        self.running += 1
        try:
            await asyncio.sleep(0.001)
            n = len(req.prompt_ids)
            out = [PATTERN[(n + i) % len(PATTERN)] for i in range(req.max_tokens)]
            now = time.time()
            return GenerateResult(req.request_id, out, [-0.5] * len(out), "length", 0, n, self.name, now, now)
        finally:
            self.running -= 1

    async def abort(self, request_id: str) -> None:
        pass

    async def telemetry(self) -> Telemetry:
        return Telemetry(self.name, time.monotonic(), 0.0, 10_000, self.running, 0, 0, block_size=1)


@pytest.mark.timeout(30)
def test_turns_as_chunks_give_generated_plus_observation_ids_and_the_mask():
    engines = [ScriptedEngine("i0"), ScriptedEngine("i1")]
    cfg = SchedulerConfig(policy="context", chunk_size=4, kv_capacity_tokens=10_000, block_size=1,
                          telemetry_interval_s=0.01)
    obs = (61, 61, 10)
    turns_seen: dict[str, list[TurnEnd]] = {}
    in_env = {"now": 0, "max_while_running": 0}

    async def on_turn_end(end: TurnEnd) -> TurnReply:
        turns_seen.setdefault(end.request.request_id, []).append(end)
        in_env["now"] += 1
        await asyncio.sleep(0.005)  # the tool works; chunks of others go on meanwhile
        in_env["now"] -= 1
        if end.turn == 0:
            return TurnReply((62,))
        return TurnReply(done=True) if end.turn == 3 else TurnReply(obs)

    ps = prompts(2, prompt_len=4)
    result = asyncio.run(RolloutDriver(engines, cfg).run(
        ps, group_size=3, sampling=SamplingParams(max_tokens=200), turns=StopMatcher(["</c>"], decode),
        on_turn_end=on_turn_end))
    assert len(result.samples) == 6
    for s in result.samples:
        ends = turns_seen[s.request_id]
        assert [e.turn for e in ends] == [0, 1, 2, 3] and s.turns == 3
        assert all(decode(e.token_ids).endswith("</c>") and decode(e.token_ids).count("</c>") == 1 for e in ends[1:])
        expected = [62]
        mask = [0]
        for k, e in enumerate(ends[1:], start=1):
            expected += list(e.token_ids)
            mask += [1] * len(e.token_ids)
            if k < 3:
                expected += list(obs)
                mask += [0] * len(obs)
        assert s.response_ids == expected and s.loss_mask == mask
        assert len(s.logprobs) == sum(mask)
    # some turn's stop sequence straddled two chunks (the engine never saw it whole)
    assert any(c.turn > 0 for c in result.chunks)
    straddled = [c for c in result.chunks if c.new_tokens < c.max_tokens and c.new_tokens < 4]
    assert straddled
    # every chunk's prompt is the whole history: prompt, first observation, turns, observations
    for e in engines:
        for r in e.requests:
            assert r.stop == ("</c>",)


def run_multi_turn(env_cfg, env_args, max_tokens=60, *, env="tests.multiturn.envs_for_tests:ScriptEnv",
                   prompt_specs=None, vocab_size=None):
    """A multi-turn rollout of `env` (its runner built from env_cfg and env_args) over two scripted
    engines, two samples per prompt (`prompt_specs`, default `prompts(2)`)."""
    from seer.rollout.base import RolloutContext, RolloutRequest
    from seer.rollout.multi_turn import multi_turn_rollout
    from seer.tasks.env import EnvRunner
    from seer.tasks.reward import RewardRunner

    runner = EnvRunner(env, env_cfg, env_args, vocab_size=vocab_size)
    ctx = RolloutContext([ScriptedEngine("i0"), ScriptedEngine("i1")],
                         SchedulerConfig(policy="context", chunk_size=4, kv_capacity_tokens=10_000, block_size=1,
                                         telemetry_interval_s=0.01),
                         RewardRunner("seer.tasks.env:zero_reward"), env=runner, decode=decode,
                         encode=lambda text: [ord(c) for c in text])
    specs = prompts(2) if prompt_specs is None else prompt_specs
    try:
        return asyncio.run(multi_turn_rollout(ctx, RolloutRequest(0, specs, 2, SamplingParams(max_tokens=max_tokens))))
    finally:
        runner.close()


@pytest.mark.timeout(60)
def test_an_observation_over_the_budget_and_the_turn_limit_end_trajectories_with_reward_0():
    from seer.tasks.env import EnvConfig

    big = run_multi_turn(EnvConfig(mode="thread", stop=("</c>",)), {"obs": (61,) * 80, "turns": 3})
    assert len(big.samples) == 4  # no sample lost
    for s in big.samples:
        assert s.reward == 0.0 and "does not fit within rollout.max_tokens" in s.reward_error and s.turns == 1
        assert s.finish_reason == "length" and s.loss_mask == [1] * len(s.response_ids)
    capped = run_multi_turn(EnvConfig(mode="thread", stop=("</c>",), max_turns=2), {"obs": (61,), "turns": 5})
    assert all(s.reward == 0.0 and "env.max_turns (2)" in s.reward_error and s.turns == 2 for s in capped.samples)
    done = run_multi_turn(EnvConfig(mode="thread", stop=("</c>",), max_turns=2), {"obs": (61,), "turns": 2})
    assert all(s.reward == 1.0 and s.reward_error is None and s.turns == 2 for s in done.samples)
    assert done.stats.num_samples == 4 and done.stats.extra["turns_mean"] == 2


@pytest.mark.timeout(30)
def test_no_chunk_asks_the_engine_for_more_than_its_turn_may_still_generate():
    """With max_turn_tokens 6 and chunks of 4, a turn's second chunk asks for 2 tokens, not 4:
    an engine never generates tokens the turn's cut would throw away."""
    engines = [ScriptedEngine("i0")]
    cfg = SchedulerConfig(policy="context", chunk_size=4, kv_capacity_tokens=10_000, block_size=1,
                          telemetry_interval_s=0.01)

    async def on_turn_end(end: TurnEnd) -> TurnReply:
        return TurnReply(done=True) if end.turn == 2 else TurnReply((61,))

    result = asyncio.run(RolloutDriver(engines, cfg).run(
        prompts(1), group_size=1, sampling=SamplingParams(max_tokens=200), turns=StopMatcher([], decode, 6),
        on_turn_end=on_turn_end))
    (s,) = result.samples
    assert s.turns == 2 and s.loss_mask == [0] + [1] * 6 + [0] + [1] * 6
    asked = [r.max_tokens for r in engines[0].requests]
    assert asked == [4, 2, 4, 2], asked
    assert sum(c.new_tokens for c in result.chunks) == 12  # nothing generated past a turn's end
