"""The rollout contract: what one iteration's rollout is given and what it returns.

`rollout.function` names any `module:function` with the `RolloutFunction` signature. The loop
calls it once per iteration, after the fleet checked that every live instance serves
`request.weight_version`, and trains on the RolloutBatch it returns. The built-ins sit beside
this file: `single_turn` (the default) and `multi_turn` (chosen when the task has an environment).

A rollout function drives the instances through the scheduler's `RolloutDriver` (chunks, policy,
KV-aware placement) and fills the batch from its result (`seer.rollout.stats.stats_from_result`
for the stats, `dropped_instances` for the instances the driver gave up on, which the loop hands
to the fleet). A rollout that over-issues (partial rollout, dynamic sampling: more groups than it
keeps) passes the driver a `stop_when`, which ends the rollout once the samples finished so far
suffice; the requests left are in `RolloutResult.unfinished`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from seer.scheduler import SchedulerConfig
from seer.scheduler.driver import RolloutResult
from seer.scheduler.events import Progress
from seer.tasks.env import EnvRunner
from seer.tasks.reward import RewardRunner
from seer.types import InstanceBackend, InstanceDrop, PromptSpec, RolloutBatch, SamplingParams


@dataclass(frozen=True)
class DynamicSampling:
    """rollout.dynamic_sampling (DAPO's, on-policy): the batch is `len(prompts)` groups whose rewards
    differ, drawn from the data stream in order (seer.rollout.dynamic says how)."""

    # (offset from the iteration's first prompt, count) -> the data stream's prompts there; offset 0
    # gives the request's own `prompts` first
    more_prompts: Callable[[int, int], Sequence[PromptSpec]]
    extra_groups: int = 0  # dispatched with the first round beyond the batch: the expected all-equal groups
    max_groups: int = 0  # the most groups one iteration dispatches, all rounds together


@dataclass(frozen=True)
class RolloutRequest:
    """What one iteration's rollout must produce: `group_size` samples of each prompt, drawn with
    the weights of `weight_version` (every sample records it).

    With `dynamic` set the batch holds as many groups as `prompts` does, all of differing rewards,
    and the rollout reports in `stats.extra["prompts_consumed"]` how far into the data stream it
    went (a rollout that ignores `dynamic` consumed `len(prompts)`)."""

    iteration: int
    prompts: Sequence[PromptSpec]
    group_size: int
    sampling: SamplingParams
    weight_version: int = 0
    dynamic: DynamicSampling | None = None


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
    # The gateway rollout (seer.rollout.gateway, task.agent): the run's gateway and its AgentRunner.
    gateway: Any = None
    agents: Any = None


RolloutFunction = Callable[[RolloutContext, RolloutRequest], Awaitable[RolloutBatch]]


def iteration_sampling(req: RolloutRequest) -> SamplingParams:
    """The request's sampling with its base seed (if any) made distinct per iteration."""
    base_seed = req.sampling.seed
    return replace(req.sampling, seed=None if base_seed is None else base_seed * 1_000_003 + req.iteration)


def driver_args(ctx: RolloutContext, req: RolloutRequest, round_index: int = 0) -> dict:
    """The keywords of `RolloutDriver.run` every built-in rollout passes: the request's group size,
    sampling, weights and the context's oracle and progress; request ids `it<i>-` (a dynamic-sampling
    round after the first: `it<i>-r<k>-`, so no two rounds share an id)."""
    return {"group_size": req.group_size, "sampling": iteration_sampling(req), "weight_version": req.weight_version,
            "request_id_prefix": f"it{req.iteration}-" + (f"r{round_index}-" if round_index else ""),
            "true_lengths": ctx.true_lengths, "on_progress": ctx.on_progress}


def dropped_instances(result: RolloutResult) -> list[InstanceDrop]:
    """The instances the driver dropped mid-rollout, for `RolloutBatch.dropped` (the fleet drops them too)."""
    return [InstanceDrop(name, why, round(t - result.start_time, 3)) for name, why, t in result.dropped]


__all__ = ["DynamicSampling", "RolloutContext", "RolloutFunction", "RolloutRequest", "driver_args", "dropped_instances",
           "iteration_sampling"]
