"""Issue 36 item 8: a session that failed for Seer's reasons (a fault of the gateway, an agent host
that could not start) is no sample of the policy: it is marked `failure: "system"`, keeps reward None,
is left out of training (its group's advantages computed without it, the group dropped when fewer
than 2 sessions remain), counted in the iteration's record, and stops the iteration under
`rollout.reward_error_policy: abort`. An agent's own failure stays its sample, scored 0 and trained.
The real gateway server, scheduler driver and agents (loop mode, and process mode's host process),
on the gateway tests' scripted engine (no vLLM)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from seer.metrics_log import iteration_record
from seer.model.chat import EmbeddedChat
from seer.rollout import agents as agents_module
from seer.rollout.agents import AgentConfig, AgentRunner, AgentSpec
from seer.rollout.base import RolloutContext, RolloutRequest
from seer.rollout.gateway import Gateway, GatewayLimits, GatewayServer, gateway_rollout
from seer.tasks.reward import RewardAborted, RewardRunner
from seer.trainer.algorithms import Algorithms
from seer.trainer.config import TrainerConfig
from seer.types import SamplingParams
from tests.gateway import agents_for_tests as agents
from tests.test_metrics_fields import undocumented
from tests.gateway.test_gateway import AGENTS, TOK, CalcEngine, calc_prompts, encode, scheduler

pytestmark = pytest.mark.timeout(120)


def decode(ids):
    return TOK.decode(ids, skip_special_tokens=True)


async def rollout(agent: str, prompts, group_size: int, *, mode: str = "loop", on_error: str = "zero"):
    gw = Gateway(EmbeddedChat(TOK.eos_token), encode, lambda ids: TOK.decode(ids, skip_special_tokens=False), decode,
                 TOK.eos_token, agents.MODEL, GatewayLimits(max_call_tokens=64, max_context_tokens=4096))
    server = GatewayServer(gw, "127.0.0.1")
    await server.start()
    runner = AgentRunner(AgentSpec.parse(f"{AGENTS}:{agent}", 60.0, cfg=AgentConfig(mode=mode)), 8)
    try:
        ctx = RolloutContext([CalcEngine("e0"), CalcEngine("e1")], scheduler(),
                             RewardRunner("seer.tasks.calculator:score", on_error=on_error),
                             decode=decode, encode=encode, gateway=gw, agents=runner)
        return await gateway_rollout(ctx, RolloutRequest(0, prompts, group_size, SamplingParams(max_tokens=64)))
    finally:
        await runner.close()
        await server.close()


def trained(batch):
    """The trainer's own selection and advantages: (request id, advantage) per trained sequence."""
    from seer.trainer.trainer import Trainer

    cfg = TrainerConfig(advantage_estimator="dr_grpo")
    seqs = Trainer.sequences_from_batch(SimpleNamespace(config=cfg, algorithms=Algorithms.from_config(cfg)), batch)
    ids = [s.request_id for g in batch.train_groups() for s in g if s.response_ids]
    assert len(ids) == len(seqs)
    return {rid: t.advantage for rid, t in zip(ids, seqs)}


# group 0 loses one session of three (two remain: trained, compared with each other only); group 1
# loses two of three (one left: no baseline, dropped)
FAULTY = {"it0-g0-s0", "it0-g1-s0", "it0-g1-s1"}


@pytest.fixture
def gateway_fault(monkeypatch):
    """A fault of ours inside the gateway (as a bug would raise) on the second turn of FAULTY's sessions."""
    real = Gateway._on_turn_end

    async def faulty(self, end, start_agent):
        if self.by_request[end.request.request_id].id in FAULTY and end.turn == 2:
            raise RuntimeError("injected gateway fault")
        return await real(self, end, start_agent)

    monkeypatch.setattr(Gateway, "_on_turn_end", faulty)


def test_a_gateway_fault_is_a_system_failure_left_out_of_training_and_its_group_dropped_below_two(gateway_fault):
    batch = asyncio.run(rollout("failing_after_one_call_agent", calc_prompts([9, 13]), 3))
    by_session = {s.branch.session: s for s in batch.samples}
    for sid, s in by_session.items():
        if sid in FAULTY:
            assert s.failure == "system" and s.reward is None and "injected gateway fault" in s.reward_error, sid
        elif sid == "it0-g0-s2":  # the agent's own exception: its sample, scored 0
            assert s.failure == "agent" and s.reward == 0.0 and "the agent's own bug" in s.reward_error
        else:
            assert s.failure is None and s.reward == 1.0, (sid, s.reward_error)
    adv = trained(batch)
    # group 0: s1 (1.0) and s2 (0.0, the agent's failure) without s0: dr_grpo's +-0.5, not s0's 0 in the mean
    assert adv == {"it0-g0-s1": 0.5, "it0-g0-s2": -0.5}, adv
    rec = iteration_record(batch)
    assert rec["system_failed_sessions"] == rec["system_failed_samples"] == 3
    assert rec["num_sessions"] == rec["num_samples"] == 6 and rec["num_trained_samples"] == 2
    assert rec["agent_errors"] == 1 and len(rec["system_error_messages"]) == 3
    assert rec["reward_mean"] == rec["reward_mean_sessions"] == pytest.approx(2 / 3)  # failures of ours not in it
    assert undocumented(rec) == []  # docs/watching.md names every field


def test_a_system_failure_under_reward_error_policy_abort_stops_the_iteration(gateway_fault):
    with pytest.raises(RewardAborted, match="the system failed the session.*injected gateway fault"):
        asyncio.run(rollout("calc_agent", calc_prompts([9]), 3, on_error="abort"))


def test_an_agent_host_that_does_not_start_in_time_fails_its_sessions_as_the_systems(monkeypatch):
    """Process mode: the host is a real process that cannot be ready within 1 ms."""
    monkeypatch.setattr(agents_module, "HOST_START_S", 0.001)
    batch = asyncio.run(rollout("calc_agent", calc_prompts([9]), 2, mode="process"))
    assert len(batch.samples) == 2
    for s in batch.samples:
        assert s.failure == "system" and s.reward is None and "did not start within" in s.reward_error
    assert batch.train_groups() == []  # nothing of the policy's to train: the loop skips the step
    rec = iteration_record(batch)
    assert rec["system_failed_sessions"] == 2 and rec["num_trained_samples"] == 0 and rec["reward_mean"] is None
