"""Multi-turn rollout on real vLLM instances of the tiny model, environments in real worker processes:
exact token ids across turns, the loss mask, a stop sequence split across two chunks, a turn after
a tool wait served from the cached prefix, a hanging and a raising environment."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from seer.rollout.base import RolloutContext, RolloutRequest
from seer.rollout.multi_turn import multi_turn_rollout
from seer.scheduler import SchedulerConfig
from seer.tasks.env import EnvConfig, EnvRunner
from seer.tasks.reward import RewardRunner
from seer.types import GenerateRequest, PromptSpec, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SCRIPT = "tests.multiturn.envs_for_tests:ScriptEnv"
# Longer than one KV block (128 tokens on vLLM's CPU backend): only full blocks are cached.
PROMPT = "Take away 1-9 at a time until nothing is left.\n" * 3 + "Take away 1-9 at a time until nothing is left.\nstart=0037\n"
CHUNK = 8
BLOCK = 128
MAX_TURN = 12  # tokens of a turn (the environment's max_turn_tokens)


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def rollout(vllm_pool, tok, prompts, env_cfg, env_args, *, group_size=2, chunk=CHUNK, max_tokens=160):
    env = EnvRunner(SCRIPT, env_cfg, env_args)
    ctx = RolloutContext(
        vllm_pool.clients,
        SchedulerConfig(policy="context", chunk_size=chunk, kv_pool=False, telemetry_interval_s=0.2),
        RewardRunner("seer.tasks.env:zero_reward"), env=env,
        decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
        encode=lambda text: list(tok(text, add_special_tokens=False)["input_ids"]))

    async def go():
        try:
            return await multi_turn_rollout(ctx, RolloutRequest(0, prompts, group_size,
                                                                SamplingParams(temperature=0.0, max_tokens=max_tokens)))
        finally:
            for c in vllm_pool.clients:
                await c.close()

    try:
        return asyncio.run(go())
    finally:
        env.close()


def greedy(vllm_pool, ids, n):
    async def go():
        try:
            r = await vllm_pool.clients[0].generate(GenerateRequest("mt-greedy", ids, n, SamplingParams(temperature=0.0)))
            return r.token_ids
        finally:
            await vllm_pool.clients[0].close()

    return asyncio.run(go())


def straddling_stop(text: str, chunk: int, max_end: int) -> tuple[str, int]:
    """The shortest stop sequence whose first occurrence in `text` begins before `chunk` and ends
    after it, by `max_end`; (it, its end). There always is one: text[:chunk + 1] occurs first at 0."""
    for length in range(2, chunk + 2):
        for start in range(chunk - 1, max(-1, chunk - length), -1):
            s, end = text[start:start + length], start + length
            if end <= min(max_end, len(text)) and text.find(s) == start:
                return s, end
    raise AssertionError(f"{text!r} is shorter than {chunk + 1} characters")


def test_turns_on_divided_rollout_token_ids_mask_stop_across_chunks_and_cached_prefix(vllm_pool, tok):
    prompt_ids = list(tok(PROMPT)["input_ids"])
    assert len(prompt_ids) > BLOCK
    first = greedy(vllm_pool, prompt_ids, 24)
    text = tok.decode(first)
    assert len(text) == len(first), text  # byte tokens: characters are tokens
    # the stop sequence is chosen from the greedy output, so that it straddles the first chunk's end
    stop, end = straddling_stop(text, CHUNK, max_end=MAX_TURN)
    obs = tuple(tok("=0030\n", add_special_tokens=False)["input_ids"])
    batch = rollout(vllm_pool, tok, [PromptSpec(0, PROMPT, prompt_ids, {})],
                    EnvConfig(stop=(stop,), workers=2, max_turn_tokens=MAX_TURN), {"obs": obs, "turns": 2})
    assert len(batch.samples) == 2
    for s in batch.samples:
        turn1 = first[:end]  # the turn ends where the stop sequence does, though no engine saw it whole
        n2 = len(s.response_ids) - len(turn1) - len(obs)
        turn2 = greedy(vllm_pool, prompt_ids + turn1 + list(obs), n2)  # the same tokens uninterrupted
        assert s.response_ids[:len(turn1)] == turn1
        assert tuple(s.response_ids[len(turn1):len(turn1) + len(obs)]) == obs
        assert s.response_ids[len(turn1) + len(obs):] == turn2 and turn2
        assert tok.decode(turn2).endswith(stop) or turn2[-1] == tok.eos_token_id or len(turn2) == MAX_TURN
        assert s.loss_mask == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
        assert len(s.logprobs) == sum(s.loss_mask) and s.turns == 2 and s.reward == 1.0
        chunks = [c for c in batch.chunks if c.request_id == s.request_id]
        assert [c.turn for c in chunks][:2] == [0, 0]  # turn 1 took two chunks
        after_tool = next(c for c in chunks if c.turn == 1)
        # the first chunk after the tool wait found the history's full KV blocks cached
        assert after_tool.cached_prefix_tokens >= (len(prompt_ids) + len(turn1)) // BLOCK * BLOCK > 0, [
            (c.instance, c.turn, c.prompt_tokens, c.cached_prefix_tokens, c.reason) for c in chunks]
    assert batch.stats.extra["env_errors"] == 0 and batch.stats.extra["observation_tokens"] == 2 * len(obs)


def test_a_hanging_environment_times_out_and_a_raising_one_is_counted_without_losing_samples(vllm_pool, tok):
    prompt_ids = list(tok(PROMPT)["input_ids"])
    prompts = [PromptSpec(0, PROMPT, prompt_ids, {"hang": True}), PromptSpec(1, PROMPT, prompt_ids, {})]
    batch = rollout(vllm_pool, tok, prompts, EnvConfig(stop=("\n",), timeout_s=2.0, workers=4),
                    {"hang_s": 3600, "turns": 3}, max_tokens=120)
    assert len(batch.samples) == 4
    by_group = batch.groups()
    hung_done = max(s.finish_time for s in by_group[0])
    assert all(s.finish_time < hung_done for s in by_group[1])  # the others did not wait for the hung tool
    assert all(s.reward == 1.0 and s.turns == 3 for s in batch.samples)  # an error observation, then on
    assert batch.stats.extra["env_timeouts"] == 2 and batch.stats.extra["env_errors"] == 2
    hung = by_group[0][0]
    assert "error: TimeoutError" in hung.response_text

    raised = rollout(vllm_pool, tok, prompts[1:], EnvConfig(stop=("\n",), on_error="end", workers=2),
                     {"raise_in_turn": 2, "turns": 3}, max_tokens=120)
    assert [s.reward for s in raised.samples] == [0.0, 0.0]
    assert all("tool crashed" in s.reward_error and s.turns == 2 for s in raised.samples)
    assert raised.stats.extra["env_errors"] == 2 and raised.stats.extra["trajectories_ended_early"] == 2


def test_the_calculator_task_with_a_test_environment_by_path_trains_through_seer_run(
        vllm_pool, restore_base_weights, tmp_path):
    urls = "[" + ",".join(c.base_url for c in vllm_pool.clients) + "]"
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "2", "--run-dir", str(run_dir),
         "--set", "task.name=calculator", "--set", "model.preset=tiny", "--set", f"instances.urls={urls}",
         "--set", "task.env=tests.multiturn.envs_for_tests:LineEnv", "--set", "task.num_prompts=4",
         "--set", "rollout.groups_per_iteration=2", "--set", "rollout.group_size=4", "--set", "rollout.max_tokens=96",
         "--set", "env.workers=2", "--set", "scheduler.chunk_size=16"],
        capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(rec["num_samples"] == 8 for rec in recs)
    assert recs[0]["turns_max"] >= 2 and recs[0]["observation_tokens"] > 0 and recs[0]["env_errors"] == 0
    assert recs[1]["weight_version"] == 1 and recs[0].get("logprob_mismatch_mean") is not None
    samples = [json.loads(x) for x in (run_dir / "rollouts" / "iter_0001.jsonl").read_text().splitlines()]
    assert all(s["weight_version"] == 1 for s in samples) and max(s["turns"] for s in samples) >= 2
