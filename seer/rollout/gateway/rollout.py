"""The gateway's rollout function: every session of the iteration an agent run, every call a turn.

Selected when `task.agent` is set. G sessions per prompt (a GRPO group: one group id for DGDS and for
the context-aware length estimate), each one scheduler request that starts waiting for its agent's
first call. A call's new tokens are the request's observation; the model's turn is dispatched as
chunks through the run's scheduler and policy, exactly as `Environment` turns (seer.rollout.multi_turn),
so a session's turns go wherever the scheduler puts them and load their history from the KV pool.

Samples: each leaf of a session's call tree is one sample (docs/agents-gateway.md): the request's
final path, and every path a branch left behind up to its last delivered reply. Its prompt is the
path's tokens before the model's first token; its loss mask is 1 on the model's tokens only; its
log-probs are the rollout's. Every leaf of a session carries the session's reward (the agent's, or
the task's reward function on the final leaf's text) and `Sample.branch`; a leaf a branch left
behind has finish_reason "branch" (its session went on from an earlier point).

Whose failure a failed session is (`Sample.failure`, on every leaf): the agent's own (it raised, ran
past agent.timeout_s, exited or was killed, made no call): its sample, scored 0 as its reward; or
the system's (a fault of the gateway, an agent host that could not start or went away, the runner
itself failing): reward None, never trained (RolloutBatch.train_groups), counted in the record, and
under rollout.reward_error_policy: abort the iteration stops as it does for a failing reward.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from seer.request_ids import chunk_id, request_id
from seer.rollout.agents import AgentOutcome, AgentSession
from seer.rollout.base import RolloutContext, RolloutRequest, dropped_instances, iteration_sampling
from seer.rollout.gateway.core import Gateway, GatewayTurns, Session
from seer.rollout.gateway.paths import Leaf
from seer.rollout.stats import stats_from_result
from seer.scheduler import RolloutDriver
from seer.scheduler.buffer import Request
from seer.tasks.reward import RewardAborted
from seer.types import SYSTEM_FAILURE, Branch, PromptSpec, RolloutBatch, Sample


@dataclass
class _Run:
    session: Session
    prompt: PromptSpec
    task: asyncio.Task | None = None
    outcome: AgentOutcome | None = None


def split_prompt(ids: list[int], mask: list[int]) -> int:
    """Where the model's first token is: the tokens before it are the sample's prompt."""
    return next((i for i, m in enumerate(mask) if m), len(ids))


def leaf_sample(base: Sample, leaf: Leaf, n: int) -> Sample:
    """A leaf a branch left behind, as a sample of its own beside its session's final one."""
    cut = split_prompt(list(leaf.ids), list(leaf.mask))
    return replace(base, request_id=f"{base.request_id}-b{n}", prompt=replace(base.prompt, prompt_ids=list(leaf.ids[:cut])),
                   response_ids=list(leaf.ids[cut:]), loss_mask=list(leaf.mask[cut:]), logprobs=list(leaf.logprobs),
                   turns=len(leaf.calls), branch=Branch(base.branch.session, leaf.calls), response_text="",
                   finish_reason="branch")


async def gateway_rollout(ctx: RolloutContext, req: RolloutRequest) -> RolloutBatch:
    """Every session of `req.prompts` (G per prompt) run by its agent through the gateway."""
    gw: Gateway | None = ctx.gateway
    if gw is None or ctx.agents is None:
        raise ValueError("the gateway rollout needs the run's gateway and agents (task.agent set)")
    prefix = f"it{req.iteration}-"
    prompts = [replace(p, prompt_ids=[]) for p in req.prompts]  # a session's tokens are its calls'
    runs: dict[str, _Run] = {}
    ids = [(g, k, request_id(g, k, prefix)) for g in range(len(prompts)) for k in range(req.group_size)]
    gw.open_iteration(req.iteration, req.sampling, ids)
    for g, k, rid in ids:
        runs[rid] = _Run(gw.by_request[rid], req.prompts[g])
    backends = {b.name: b for b in ctx.backends}

    async def abort(r: Request) -> None:
        if r.last_instance in backends:
            await backends[r.last_instance].abort(chunk_id(r.request_id, len(r.instances) - 1, r.failures))

    gw.abort = abort

    async def agent(run: _Run) -> None:
        s = run.session
        record = {"prompt": run.prompt.text, "reference": run.prompt.reference, "index": run.prompt.index}
        try:
            run.outcome = await ctx.agents.run(AgentSession(s.id, gw.base_url, s.key, record, gw.model_name,
                                                              gw.in_process))
        except BaseException as e:  # the runner never raises for an agent's faults; this is ours
            run.outcome = AgentOutcome(None, f"agent runner failed: {e!r}", 0.0, system=True)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            gw.agent_finished(s)

    def start_agent(s: Session) -> None:
        run = runs[s.request_id]
        run.task = asyncio.create_task(agent(run))

    async def on_turn_end(end):
        return await gw.on_turn_end(end, start_agent)

    finals: dict[str, Sample] = {}

    def on_sample(sample: Sample) -> None:
        s = runs[sample.request_id].session
        ids, mask = list(sample.response_ids), list(sample.loss_mask or [])
        cut = split_prompt(ids, mask)
        sample.prompt = replace(runs[sample.request_id].prompt, prompt_ids=ids[:cut])
        sample.response_ids, sample.loss_mask = ids[cut:], mask[cut:]
        sample.turns = len(s.path.delivered_calls)
        sample.branch = Branch(s.id, s.path.delivered_calls)
        sample.response_text = ctx.decode(sample.response_ids) if ctx.decode else ""
        finals[sample.request_id] = sample

    sampling = replace(iteration_sampling(req), max_tokens=gw.limits.max_context_tokens)
    try:
        driver = RolloutDriver(list(ctx.backends), ctx.scheduler)
        result = await driver.run(prompts, group_size=req.group_size, sampling=sampling,
                                  weight_version=req.weight_version, request_id_prefix=prefix,
                                  true_lengths=ctx.true_lengths, on_sample_finished=on_sample,
                                  on_progress=ctx.on_progress, turns=GatewayTurns(gw), on_turn_end=on_turn_end)
        gw.close_iteration()  # calls from now on are refused: strictly on-policy
        tasks = [r.task for r in runs.values() if r.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        gw.close_iteration()
        for r in runs.values():
            if r.task is not None and not r.task.done():
                r.task.cancel()
    samples: list[Sample] = []
    for rid, run in runs.items():
        final = finals[rid]
        o = run.outcome or AgentOutcome(None, "the agent never ran", 0.0, system=True)
        if run.session.errors:  # the gateway's own faults (an internal error answered 500)
            final.reward, final.reward_error, final.failure = None, "; ".join(run.session.errors), SYSTEM_FAILURE
        elif o.error is not None and o.system:
            final.reward, final.reward_error, final.failure = None, o.error, SYSTEM_FAILURE
        elif o.error is not None:
            final.reward, final.reward_error, final.failure = 0.0, o.error, "agent"
        elif o.reward is not None:
            final.reward = o.reward
        elif final.response_ids:
            ctx.rewards.submit(final)
        else:
            final.reward, final.reward_error, final.failure = 0.0, "the agent made no call", "agent"
        leaves = [leaf_sample(final, leaf, n) for n, leaf in enumerate(run.session.leaves)]
        for leaf in leaves:
            leaf.response_text = ctx.decode(leaf.response_ids) if ctx.decode else ""
        samples += [*leaves, final]
    await ctx.rewards.wait_all()
    by_session: dict[str, Sample] = {s.request_id: s for s in samples}
    for s in samples:  # every leaf of a session carries its session's reward
        if s.request_id not in finals:
            final = by_session[s.request_id.rsplit("-b", 1)[0]]
            s.reward, s.reward_error, s.failure = final.reward, final.reward_error, final.failure
    failed = next((s for s in samples if s.failure == SYSTEM_FAILURE and s.request_id in finals), None)
    if failed is not None and ctx.rewards.on_error == "abort":
        raise RewardAborted(failed, "the system failed the session")
    names = [b.name for b in ctx.backends]
    stats = stats_from_result(result, req.iteration, names, finish_times=[s.finish_time for s in result.samples])
    stats.extra.update(gateway_summary(runs, samples, gw))
    return RolloutBatch(samples=samples, stats=stats, chunks=result.chunks, telemetry=result.telemetry,
                        phases=[("generate", result.start_time, result.end_time)], env_waits=result.env_waits,
                        dropped=dropped_instances(result))


def gateway_summary(runs: dict[str, _Run], samples: list[Sample], gw: Gateway) -> dict:
    """The iteration's gateway numbers (calls, branches, leaves, the agents' own errors and the
    system's) and the gateway's counters since the run began (`gateway_totals`)."""
    sessions = [r.session for r in runs.values()]
    finals = {s.request_id: s for s in samples if s.branch is not None and s.request_id in runs}
    own = [finals[rid].reward_error for rid in runs if rid in finals and finals[rid].failure == "agent"]
    system = [finals[rid].reward_error for rid in runs if rid in finals and finals[rid].failure == SYSTEM_FAILURE]
    return {
        "gateway_calls": sum(s.calls for s in sessions),
        "gateway_branches": sum(s.path.branches for s in sessions),
        "gateway_samples": len(samples),
        "gateway_sessions": len(sessions),
        "agent_errors": len(own),  # sessions the agent itself failed (scored 0, trained)
        "agent_error_messages": [e[:300] for e in own[:5]],
        "system_error_messages": [e[:300] for e in system[:5]],
        "gateway_totals": dict(gw.counters),  # run totals, not this iteration's
    }
