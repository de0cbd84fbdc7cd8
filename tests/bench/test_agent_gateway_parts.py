"""bench.agent_gateway's parts that need no gateway and no instance: token scripts, their replay,
the alternating order, the summary, and the recorded tool latencies both calculator paths wait."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as N

import pytest

from bench.agent_gateway import GWSettings, TokenReplayBackend, TokenScript, order, replay_preset, same_tokens, summarize
from seer.request_ids import chunk_id, request_id
from seer.tasks import calculator
from seer.tasks.agents.calculator_tool import CalculatorTool
from seer.tasks.env import Turn
from seer.types import GenerateRequest, GenerateResult, SamplingParams

T = TokenScript(((5, 6, 7), (8, 9)), ((), (1, 2)))  # turn 5 6 7, observation 1 2, turn 8 9


def test_a_token_script_holds_each_turn_s_model_tokens_and_finds_them_by_position():
    assert TokenScript.of([5, 6, 7, 1, 2, 8, 9], [1, 1, 1, 0, 0, 1, 1]) == T
    assert T.tokens_at(0, 2) == (5, 6) and T.tokens_at(1, 9) == (6, 7) and T.tokens_at(5, 9) == (8, 9)
    assert [T.turn_left(p) for p in range(8)] == [3, 2, 1, 0, 0, 2, 1, 0]


class Engine:
    """Generates `max_tokens` tokens of its own (what a real instance would sample)."""

    name = "i0"

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        n = req.max_tokens
        return GenerateResult(req.request_id, [100] * n, [-1.0] * n, "length", 0, len(req.prompt_ids), "i0", 0.0, 1.0)


def test_replay_generates_the_turn_s_length_and_returns_the_recorded_tokens():
    backend = TokenReplayBackend(Engine(), {(0, 1): T}, {0: 4})
    sampling = SamplingParams(temperature=1.0, max_tokens=64)
    first = asyncio.run(backend.generate(GenerateRequest(chunk_id(request_id(0, 1, "it0-"), 0), [0] * 4, 2, sampling)))
    assert first.token_ids == [5, 6] and first.finish_reason == "length"  # the chunk's budget, mid-turn
    rest = asyncio.run(backend.generate(GenerateRequest(chunk_id(request_id(0, 1, "it0-"), 1), [0] * 6, 64, sampling)))
    assert rest.token_ids == [7] and rest.finish_reason == "stop"  # the turn's end
    second = asyncio.run(backend.generate(GenerateRequest(chunk_id(request_id(0, 1, "it0-"), 2), [0] * 9, 64, sampling)))
    assert second.token_ids == [8, 9] and second.finish_reason == "stop"


def test_configurations_alternate_and_are_checked():
    assert order(["env", "gateway"], 0) == ["env", "gateway"] and order(["env", "gateway"], 1) == ["gateway", "env"]
    with pytest.raises(ValueError, match="unknown configurations"):
        GWSettings(configs="env,nope")


def test_a_replay_model_is_a_preset_or_an_untrained_size_with_its_own_result_files():
    big = replay_preset("1024x8")
    assert big.warm_start is None and big.arch.vocab_size == replay_preset("calc").arch.vocab_size  # the same tokens
    assert (big.arch.hidden_size, big.arch.num_layers, big.arch.num_heads, big.arch.num_kv_heads) == (1024, 8, 16, 4)
    assert GWSettings().stem == "agent_gateway" and GWSettings(replay_model="1024x8").stem == "agent_gateway_1024x8"
    with pytest.raises(ValueError, match="HIDDENxLAYERS"):
        GWSettings(replay_model="big")


def test_the_summary_and_the_token_check():
    runs = [{"config": "env", "model_tokens": 1000, "wall_s": 2.0}, {"config": "gateway", "model_tokens": 1000, "wall_s": 2.5}]
    rows = summarize(runs)
    assert rows["env"]["model_tokens_per_s"] == 500.0 and rows["gateway"]["vs_env"] == 0.8
    a = [N(group_id=0, sample_index=0, prompt=N(prompt_ids=[1]), response_ids=[2, 3], loss_mask=[1, 0])]
    b = [N(group_id=0, sample_index=0, prompt=N(prompt_ids=[1, 2]), response_ids=[3], loss_mask=[1, 0])]
    assert same_tokens(a, a)["same"] == 1 and same_tokens(a, b)["same"] == 0


def test_both_calculator_paths_wait_the_recorded_latencies(monkeypatch):
    ref = {"total": 12, "width": 4, "latencies": [0.01, 0.02]}
    waited = []
    monkeypatch.setattr(calculator.time, "sleep", waited.append)
    env = calculator.CalculatorEnv("p", ref)
    for text in ("<calc>0012-9</calc>", "<calc>0003-3</calc>"):
        asyncio.run(env.step(Turn(1, text, (), "stop_sequence")))

    async def sleep(s):
        waited.append(("tool", s))

    monkeypatch.setattr(asyncio, "sleep", sleep)
    tool = CalculatorTool(ref)
    assert asyncio.run(tool("0012-9")) == "0003" and asyncio.run(tool("0003-3")) == "0000"
    assert waited == [0.01, 0.02, ("tool", 0.01), ("tool", 0.02)]


def test_the_comparison_on_a_scripted_engine_gives_the_environment_s_tokens_through_the_gateway(tmp_path):
    """bench.agent_gateway's whole comparison (warm-up, replay, both paths, the clock) over the gateway
    tests' scripted engine instead of vLLM: every gateway sample holds the env run's tokens and mask,
    and every chat call is clocked."""
    from bench.agent_gateway import _records, compare, token_checks
    from seer.model import ensure_model
    from tests.gateway.test_gateway import TOK, CalcEngine

    class Engine(CalcEngine):
        async def reset_prefix_cache(self, external=False):
            return True

    s = GWSettings(groups=2, group_size=2, iterations=1, repeats=1, chunk_size=8, latency_median_s=0.0, agent_mode="loop",
                   env_mode="thread", configs="env,gateway_loop", out=str(tmp_path))
    runs, checks = [], []
    warm = asyncio.run(compare([Engine("e0"), Engine("e1")], s, TOK, ensure_model(s.model),
                               _records(s, s.groups, TOK), runs, checks, lambda m: None))
    assert warm["trajectories"] == 4 and warm["cut_by_budget"] == 0
    assert token_checks(checks)["gateway_loop"]["same"] == 4
    gw = next(r for r in runs if r["config"] == "gateway_loop")
    assert gw["calls"] == gw["clocked_calls"] > 4 and gw["agent_errors"] == 0 and gw["branches"] == 0
    assert 0 < gw["handler_s"] + gw["session_s"] < gw["wall_s"]
