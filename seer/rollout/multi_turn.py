"""Multi-turn rollout: every turn of every trajectory on divided rollout, its environment in workers.

Selected when `task.env` is set. Each turn is dispatched as chunks through the same scheduler
and policy as single-turn rollout; when a turn ends (the environment's stop sequence, matched by
Seer across chunk boundaries, or EOS, or env.max_turn_tokens) the trajectory holds no instance
slot while its environment works, and its KV stays in the instances' prefix caches and the pool.
The next turn's prompt is the whole history, so whichever instance the scheduler picks finds the
prefix there (locally or in the pool) instead of re-prefilling it.

Token-in, token-out: a sample's response is exactly the model's tokens and the observation tokens
(tokenized once, or given as ids by the environment); its loss mask is 1 on the model's tokens,
and its log-probs cover those only. `rollout.max_tokens` bounds the whole response (every turn and
observation); a trajectory that reaches it, or env.max_turns, or gets an observation that would
not fit, ends with reward 0 and the reason in `reward_error`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from seer.rollout.base import RolloutContext, RolloutRequest, driver_args, dropped_instances
from seer.rollout.dynamic import run_rounds
from seer.rollout.stats import stats_from_result
from seer.scheduler import RolloutDriver
from seer.scheduler.turns import StopMatcher, TurnEnd, TurnReply
from seer.tasks.env import EnvConfig, EnvReply, EnvStats, Turn
from seer.types import RolloutBatch, Sample


@dataclass
class _Outcome:
    """What the rollout learns of a trajectory beyond its tokens: its reward and errors."""

    reward: float | None = None
    error: str | None = None  # what ended it early (the sample's reward_error)
    env_failed: bool = False  # the environment's own error ended it (Sample.failure "environment")
    env_errors: int = 0  # environment calls that raised or timed out (shown as error observations, or the end)
    env_wait_s: float = 0.0


async def multi_turn_rollout(ctx: RolloutContext, req: RolloutRequest) -> RolloutBatch:
    """Every trajectory of `req.prompts` (G per prompt), each rewarded by its environment."""
    if ctx.env is None or ctx.decode is None or ctx.encode is None:
        raise ValueError("multi-turn rollout needs the context's env, decode and encode (task.env set)")
    env, decode, encode = ctx.env, ctx.decode, ctx.encode
    cfg: EnvConfig = env.cfg
    prompts = list(req.prompts)  # this round's (rollout.dynamic_sampling runs more than one)
    outcomes: dict[str, _Outcome] = {}
    before = replace(env.stats, error_samples=list(env.stats.error_samples))

    def end_with(o: _Outcome, reward: float, error: str | None, finish: str) -> TurnReply:
        o.reward, o.error = reward, error
        return TurnReply(done=True, finish_reason=finish)

    async def on_turn_end(end: TurnEnd) -> TurnReply:
        r = end.request
        o = outcomes.setdefault(r.request_id, _Outcome())
        if end.reason == "length":
            env.discard(r.request_id)
            return end_with(o, 0.0, f"rollout.max_tokens ({r.max_tokens}) reached in turn {end.turn}", "length")
        t0 = time.monotonic()
        if end.turn == 0:
            prompt = prompts[r.group_id]
            reply: EnvReply = await env.start(r.request_id, prompt.text, prompt.reference)
        else:
            turn = Turn(end.turn, decode(list(end.token_ids)), end.token_ids, end.reason)
            reply = await env.step(r.request_id, turn)
        o.env_wait_s += time.monotonic() - t0
        error = None if reply.error is None else f"turn {end.turn}: {reply.error}"
        o.env_errors += reply.error is not None
        if reply.done:
            env.discard(r.request_id)
            o.env_failed = error is not None
            if reply.reward is None:
                return end_with(o, 0.0, error or "the environment ended without a reward", "error" if error else "stop")
            return end_with(o, reply.reward, error, "error" if error else "stop")
        if end.turn >= cfg.max_turns:
            env.discard(r.request_id)
            return end_with(o, 0.0, f"env.max_turns ({cfg.max_turns}) reached", "length")
        obs = reply.observation
        ids = [] if obs is None else list(obs.token_ids) if obs.token_ids is not None else encode(obs.text)
        if r.generated + len(ids) >= r.max_tokens:
            env.discard(r.request_id)
            return end_with(o, 0.0, f"turn {end.turn}: an observation of {len(ids)} tokens does not fit within "
                                    f"rollout.max_tokens ({r.max_tokens})", "length")
        return TurnReply(tuple(ids))

    def on_sample(sample: Sample) -> None:
        o = outcomes.get(sample.request_id, _Outcome())
        sample.response_text = decode(sample.response_ids)
        sample.reward, sample.reward_error = (0.0 if o.reward is None else o.reward), o.error
        if o.env_failed:
            sample.failure = "environment"

    driver = RolloutDriver(list(ctx.backends), ctx.scheduler)

    async def run_round(round_prompts, round_index: int, stop_when):
        prompts[:] = round_prompts
        result = await driver.run(prompts, **driver_args(ctx, req, round_index), on_sample_finished=on_sample,
                                  turns=StopMatcher(env.stop, decode, cfg.max_turn_tokens), on_turn_end=on_turn_end,
                                  stop_when=stop_when)
        for u in result.unfinished:  # stopped mid-trajectory (dynamic sampling had enough): its environment goes
            env.discard(u.request_id)
        return result

    result, samples, counts = await run_rounds(req, run_round)
    names = [b.name for b in ctx.backends]
    stats = stats_from_result(result, req.iteration, names, finish_times=[s.finish_time for s in result.samples])
    stats.extra.update(turn_summary(result.samples, outcomes, env.stats, before))
    stats.extra.update(counts)
    return RolloutBatch(samples=samples, stats=stats, chunks=result.chunks, telemetry=result.telemetry,
                        phases=[("generate", result.start_time, result.end_time)], env_waits=result.env_waits,
                        dropped=dropped_instances(result))


def turn_summary(samples: list[Sample], outcomes: dict[str, _Outcome], now: EnvStats, before: EnvStats) -> dict:
    """The iteration's multi-turn numbers: turns, observation tokens, environment calls and errors."""
    turns = sorted(s.turns for s in samples)
    obs = sum(len(s.loss_mask) - sum(s.loss_mask) for s in samples if s.loss_mask is not None)
    return {
        "turns_mean": sum(turns) / len(turns) if turns else None,
        "turns_max": turns[-1] if turns else None,
        "observation_tokens": obs,
        "env_calls": now.calls - before.calls,
        "env_errors": now.errors - before.errors,
        "env_timeouts": now.timeouts - before.timeouts,
        "env_pools_broken": now.pools_broken - before.pools_broken,  # worker processes that died (run.log says so)
        "env_busy_s": round(now.busy_s - before.busy_s, 3),
        "env_wait_s": round(sum(o.env_wait_s for o in outcomes.values()), 3),
        "trajectories_with_env_errors": sum(1 for o in outcomes.values() if o.env_errors),
        "trajectories_ended_early": sum(1 for o in outcomes.values() if o.error is not None),
        "env_error_messages": now.error_samples[len(before.error_samples):],
    }
