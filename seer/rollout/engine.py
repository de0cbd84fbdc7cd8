"""One iteration's rollout: prompts → G samples each on the instance pool → rewards → stats.

The scheduling policy (group_rr baseline, divided, context, …) is whatever the scheduler
config names; this module only joins the driver, the asynchronous reward runner and the
statistics into a typed RolloutBatch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from collections.abc import Callable, Mapping, Sequence

from seer.types import InstanceBackend
from seer.rollout.stats import instance_stats, iteration_stats
from seer.types import IterationStats, PromptSpec, RolloutBatch, SamplingParams
from seer.scheduler import RolloutDriver, SchedulerConfig
from seer.scheduler.driver import RolloutResult
from seer.scheduler.events import Progress
from seer.tasks.reward import RewardRunner


class RolloutEngine:
    def __init__(
        self,
        backends: Sequence[InstanceBackend],
        scheduler: SchedulerConfig,
        rewards: RewardRunner,
        *,
        group_size: int,
        sampling: SamplingParams,
    ):
        self.backends = list(backends)
        self.scheduler = scheduler
        self.rewards = rewards
        self.group_size = group_size
        self.sampling = sampling
        self.driver = RolloutDriver(self.backends, scheduler)

    def remove(self, names: Sequence[str]) -> None:
        """Stop using these instances (dropped from the pool) from the next iteration on."""
        self.backends = [b for b in self.backends if b.name not in set(names)]
        self.driver = RolloutDriver(self.backends, self.scheduler)

    async def run(
        self,
        prompts: Sequence[PromptSpec],
        iteration: int,
        *,
        weight_version: int = 0,
        true_lengths: Mapping | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> RolloutBatch:
        """Every sample of `prompts`, rewarded, with the iteration's stats.

        Rewards start as each sample finishes (they overlap the rest of the rollout); the
        call returns once the last reward is in.
        """
        base_seed = self.sampling.seed
        sampling = replace(self.sampling, seed=None if base_seed is None else base_seed * 1_000_003 + iteration)
        try:
            result = await self.driver.run(
                prompts,
                group_size=self.group_size,
                sampling=sampling,
                weight_version=weight_version,
                request_id_prefix=f"it{iteration}-",
                true_lengths=true_lengths,
                on_sample_finished=self.rewards.submit,
                on_progress=on_progress,
            )
            await self.rewards.wait_all()
        finally:
            for b in self.backends:  # HTTP sessions belong to this event loop
                close = getattr(b, "close", None)
                if close is not None:
                    await close()
        return RolloutBatch(samples=result.samples, stats=stats_from_result(result, iteration, [b.name for b in self.backends]))


def stats_from_result(result: RolloutResult, iteration: int, names: list[str]) -> IterationStats:
    """Per-iteration stats from the driver's raw chunk events and telemetry timeline."""
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    tokens: dict[str, int] = defaultdict(int)
    for c in result.chunks:
        busy[c.instance].append((c.dispatch_time, c.complete_time))
        tokens[c.instance] += c.new_tokens
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
    drafts = sum(last[n].spec_num_drafts - first[n].spec_num_drafts for n in last)
    accepted = sum(last[n].spec_num_accepted_tokens - first[n].spec_num_accepted_tokens for n in last)
    return 1.0 + accepted / drafts if drafts > 0 else None
