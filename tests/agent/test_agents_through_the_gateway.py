"""The three calculator agents (seer.tasks.agents) through the real gateway (seer.rollout.gateway), on
the gateway tests' scripted engine: each gives the `Environment` path's tokens, masks, log-probs and
rewards exactly, contained in its own processes (agent.mode: process; the command agent a program).

Seer's gateway is imported as any module is: a broken import fails these tests, it never skips them.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from seer.model.chat import EmbeddedChat
from seer.rollout.agents import AgentRunner, AgentSpec
from seer.rollout.base import RolloutContext, RolloutRequest
from seer.rollout.gateway import Gateway, GatewayLimits, GatewayServer, gateway_rollout
from seer.rollout.multi_turn import multi_turn_rollout
from seer.tasks.env import EnvConfig, EnvRunner
from seer.tasks.reward import RewardRunner
from seer.types import SamplingParams
from tests.gateway import agents_for_tests as gateway_agents
from tests.gateway.test_gateway import TOK, CalcEngine, calc_prompts, encode, scheduler

TARGETS = {"openai": ("seer.tasks.agents.calculator_openai:agent", {"latency_median_s": 0.0}),
           "sdk": ("seer.tasks.agents.calculator_sdk:agent", {"latency_median_s": 0.0}),
           "command": (f"{sys.executable} -m seer.tasks.agents.calculator_command --latency-median-s 0", None)}


def decode(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=True)


async def env_path(prompts):
    env = EnvRunner("calculator", EnvConfig(mode="thread", workers=4), {"latency_median_s": 0.0})
    try:
        ctx = RolloutContext([CalcEngine("e0"), CalcEngine("e1")], scheduler(), RewardRunner("seer.tasks.env:zero_reward"),
                             env=env, decode=decode, encode=encode)
        return await multi_turn_rollout(ctx, RolloutRequest(0, prompts, 2, SamplingParams(max_tokens=256)))
    finally:
        env.close()


async def gateway_path(kind: str, prompts):
    target, args = TARGETS[kind]
    gw = Gateway(EmbeddedChat(TOK.eos_token), encode, lambda ids: TOK.decode(ids, skip_special_tokens=False), decode,
                 TOK.eos_token, gateway_agents.MODEL, GatewayLimits(max_call_tokens=64, max_context_tokens=4096))
    server = GatewayServer(gw, "127.0.0.1")
    await server.start()
    runner = AgentRunner(AgentSpec.parse(target, 120.0, args=args), 8)
    try:
        ctx = RolloutContext([CalcEngine("e0"), CalcEngine("e1")], scheduler(), RewardRunner("seer.tasks.calculator:score"),
                             decode=decode, encode=encode, gateway=gw, agents=runner)
        batch = await gateway_rollout(ctx, RolloutRequest(0, prompts, 2, SamplingParams(temperature=1.0, max_tokens=64)))
        return batch, gw
    finally:
        await runner.close()
        await server.close()


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_each_calculator_agent_gives_the_environment_paths_tokens_through_the_gateway(kind):
    prompts = calc_prompts([9, 13])
    env_batch = asyncio.run(env_path(prompts))
    gw_batch, gw = asyncio.run(gateway_path(kind, prompts))
    assert len(gw_batch.samples) == len(env_batch.samples) == 4
    for e, g in zip(env_batch.samples, gw_batch.samples, strict=True):
        assert g.prompt.prompt_ids == e.prompt.prompt_ids
        assert g.response_ids == e.response_ids and g.loss_mask == e.loss_mask and g.logprobs == e.logprobs
        assert g.reward == e.reward == 1.0 and g.reward_error is None, (g.reward, g.reward_error)
    assert gw.counters["errors"] == 0 and gw.counters["branches"] == 0
