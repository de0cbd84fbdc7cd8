"""One iteration's rollout as a plug point, and the default: divided rollout over the fleet.

`rollout.function` names any `module:function` with the `RolloutFunction` signature; the loop
calls it once per iteration, after the fleet checked every live instance serves
`request.weight_version`, and trains on the batch it returns. The default joins the scheduler's
driver (divided rollout and the configured policy), the asynchronous reward runner and the
iteration's statistics into a typed RolloutBatch.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from seer.rollout.stats import instance_stats, iteration_stats
from seer.scheduler import RolloutDriver, SchedulerConfig
from seer.scheduler.driver import RolloutResult
from seer.scheduler.events import Progress
from seer.tasks.env import EnvRunner
from seer.tasks.reward import RewardRunner
from seer.types import InstanceBackend, IterationStats, PromptSpec, RolloutBatch, SamplingParams, SpecDecodeCounters


@dataclass(frozen=True)
class RolloutRequest:
    """What one iteration's rollout must produce: `group_size` samples of each prompt, drawn with
    the weights of `weight_version` (every sample records it)."""

    iteration: int
    prompts: Sequence[PromptSpec]
    group_size: int
    sampling: SamplingParams
    weight_version: int = 0


@dataclass
class RolloutContext:
    """What a rollout function may use: the live instances (seer.types.InstanceBackend), the
    scheduler settings, the reward runner (submit each finished sample; rewards overlap the
    rollout), and a progress callback for the terminal and the log."""

    backends: Sequence[InstanceBackend]
    scheduler: SchedulerConfig
    rewards: RewardRunner
    on_progress: Callable[[Progress], None] | None = None
    true_lengths: Mapping | None = None  # benchmarks' oracle only
    # Multi-turn rollout (seer.rollout.multi_turn): the run's environments (seer.tasks.env.EnvRunner)
    # and the model's tokenizer as functions (decode: special tokens skipped; encode: none added).
    env: EnvRunner | None = None
    decode: Callable[[list[int]], str] | None = None
    encode: Callable[[str], list[int]] | None = None


RolloutFunction = Callable[[RolloutContext, RolloutRequest], Awaitable[RolloutBatch]]


async def divided_rollout(ctx: RolloutContext, req: RolloutRequest) -> RolloutBatch:
    """Every sample of `req.prompts`, rewarded, with the iteration's stats. Returns once the last
    reward is in. Instances the driver had to drop are listed in `stats.extra["instances_dropped"]`."""
    driver = RolloutDriver(list(ctx.backends), ctx.scheduler)
    result = await driver.run(
        req.prompts,
        group_size=req.group_size,
        sampling=iteration_sampling(req),
        weight_version=req.weight_version,
        request_id_prefix=f"it{req.iteration}-",
        true_lengths=ctx.true_lengths,
        on_sample_finished=ctx.rewards.submit,
        on_progress=ctx.on_progress,
    )
    await ctx.rewards.wait_all()
    names = [b.name for b in ctx.backends]
    phases = [("generate", result.start_time, result.end_time), ("reward tail", result.end_time, time.monotonic())]
    return RolloutBatch(samples=result.samples, stats=stats_from_result(result, req.iteration, names),
                        chunks=result.chunks, telemetry=result.telemetry, phases=phases)


def iteration_sampling(req: RolloutRequest) -> SamplingParams:
    """The request's sampling with its base seed (if any) made distinct per iteration."""
    base_seed = req.sampling.seed
    return replace(req.sampling, seed=None if base_seed is None else base_seed * 1_000_003 + req.iteration)


def stats_from_result(result: RolloutResult, iteration: int, names: list[str], *,
                      finish_times: list[float] | None = None) -> IterationStats:
    """Per-iteration stats from the driver's raw chunk events and telemetry timeline.

    `finish_times`: when each sample finished, where that is not its last chunk's end (multi-turn:
    a trajectory ends when its environment says so)."""
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    tokens: dict[str, int] = defaultdict(int)
    for c in result.chunks:
        busy[c.instance].append((c.dispatch_time, c.complete_time))
        tokens[c.instance] += c.new_tokens
    if finish_times is None:
        finish_times = [c.complete_time for c in result.chunks if c.request_finished]
    instances = instance_stats(names, busy, tokens, result.preemptions(), result.start_time, result.end_time)
    kv_timeline = [
        {"t": round(t.time - result.start_time, 3), "instance": t.instance, "kv_usage": round(t.kv_usage, 4),
         "running": t.num_running, "waiting": t.num_waiting}
        for t in result.telemetry
    ]
    extra = {
        **result.chunk_summary(),
        "acceptance_length": acceptance_length(result.telemetry),
        "policy_summary": result.policy_summary,
        "kv_timeline": kv_timeline,
        "instances_dropped": [{"instance": n, "reason": why, "t": round(t - result.start_time, 3)}
                              for n, why, t in result.dropped],
    }
    return iteration_stats(
        iteration, result.policy, result.start_time, result.end_time, finish_times,
        result.output_tokens, instances, extra,
    )


def acceptance_length(timeline: list) -> float | None:
    """Mean tokens per verification step (accepted drafts + the bonus token) over the run, from
    vLLM's spec-decode counters: first and last sample of each instance. None without drafts."""
    first: dict = {}
    last: dict = {}
    for t in timeline:
        first.setdefault(t.instance, t)
        last[t.instance] = t
    spec = sum((last[n].spec - first[n].spec for n in last), SpecDecodeCounters())
    return spec.mean_acceptance_length
