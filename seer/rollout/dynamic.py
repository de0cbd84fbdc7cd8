"""DAPO's dynamic sampling, the Seer way: a batch of informative groups, strictly on-policy.

A group whose rewards are all equal has zero advantage under every group-baseline estimator and
carries no gradient; DAPO replaces such groups with fresh ones until the batch holds the configured
number of informative groups. Seer does so inside the iteration, on the same weights: every round
below runs on the instances that serve `weight_version`, so no kept sample comes from older weights.

- **Dispatch order, not finish order.** The batch is the first N informative groups *in dispatch
  order* (the data stream's order). A round stops (`stop_when`) once every group up to the N-th
  informative one is complete and rewarded; groups dispatched after it are aborted or, if they
  finished early, not used. Which groups are kept therefore never depends on how fast they
  generated, so short responses are not favoured.
- **No tail of refills.** The first round dispatches N + `extra_groups` at once, `extra_groups`
  estimated by the loop from the previous iteration's share p of all-equal groups
  (N / (1 - p) - N). The spare groups run beside the batch's own, filling slots the batch's long
  groups leave idle, instead of starting after them. Only when even these fall short does a
  further round start, sized from this iteration's observed share; such a round does add a tail
  (`dynamic_refill_rounds` counts them), which the estimate makes rare after the first iteration.
- **Bounded.** At most `max_groups` groups per iteration (rollout.dynamic_sampling_max_groups,
  default 4 N). If they still hold fewer than N informative groups, the batch is filled up to N with
  all-equal groups in dispatch order (zero advantage; slime's keep-when-insufficient) and
  `dynamic_short_groups` says how many.
- **Data order and resume.** The groups up to the N-th informative one are consumed (the all-equal
  ones are dropped, as DAPO drops them); the rest return to the stream and lead the next iteration.
  The rollout reports `prompts_consumed`; the loop advances its prompt cursor by it and commits the
  cursor with each checkpoint (loop_state.json), so a resumed run draws what an uninterrupted one
  would have drawn from there (the groups themselves are sampled afresh).

The decision uses the task's rewards, before any `trainer.reward_shaping`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from seer.rollout.base import RolloutRequest
from seer.scheduler.driver import RolloutResult, StopCallback
from seer.types import PromptSpec, Sample

MAX_GROUPS_FACTOR = 4  # rollout.dynamic_sampling_max_groups when unset: this many times the batch's groups
MAX_ALL_EQUAL_SHARE = 0.9  # a refill round is sized as if at most this share were all-equal

# (prompts, round index, stop_when) -> the round's result, every finished sample rewarded (the
# single-turn and multi-turn rollouts each pass their driver.run)
RoundRunner = Callable[[Sequence[PromptSpec], int, StopCallback], Awaitable[RolloutResult]]


def informative(samples: Sequence[Sample]) -> bool:
    """A group carries a gradient: its rewards (all known) are not all equal."""
    rewards = [s.reward for s in samples]
    return len(rewards) >= 2 and max(rewards) != min(rewards)


def _complete(samples: Sequence[Sample] | None, group_size: int) -> bool:
    return samples is not None and len(samples) == group_size and all(s.reward is not None for s in samples)


def enough_informative(needed: int, group_size: int, num_groups: int) -> StopCallback:
    """`stop_when` of a round: True once groups 0..k are complete and rewarded and `needed` of them differ."""

    def stop(samples: Sequence[Sample]) -> bool:
        by: dict[int, list[Sample]] = {}
        for s in samples:
            by.setdefault(s.group_id, []).append(s)
        found = 0
        for g in range(num_groups):
            if not _complete(by.get(g), group_size):
                return False
            found += informative(by[g])
            if found >= needed:
                return True
        return False

    return stop


def extra_groups_for(target: int, all_equal_share: float | None) -> int:
    """Groups to dispatch beyond `target` so that `target` informative ones are expected: N / (1 - p) - N."""
    if not all_equal_share:
        return 0
    p = min(max(all_equal_share, 0.0), MAX_ALL_EQUAL_SHARE)
    return max(0, math.ceil(target / (1.0 - p) - 1e-9) - target)  # (1e-9: 4 / (1 - .9) is 40.000000000000004)


@dataclass
class DynamicOutcome:
    """The kept samples (group ids = dispatch positions in the iteration), every round's raw result,
    and the counts the iteration's record carries."""

    samples: list[Sample]
    results: list[RolloutResult]
    counts: dict = field(default_factory=dict)


async def dynamic_rollout(req: RolloutRequest, run_round: RoundRunner) -> DynamicOutcome:
    """Rounds of `run_round` on the request's weights until `len(req.prompts)` informative groups
    are complete in dispatch order (see the module docstring)."""
    d = req.dynamic
    if d is None:
        raise ValueError("dynamic_rollout needs RolloutRequest.dynamic")
    target, g_size = len(req.prompts), req.group_size
    max_groups = d.max_groups or MAX_GROUPS_FACTOR * target
    kept: list[list[Sample]] = []
    all_equal: list[list[Sample]] = []
    results: list[RolloutResult] = []
    dispatched = judged = rounds = 0
    consumed: int | None = None
    while consumed is None and dispatched < max_groups:
        if rounds == 0:
            n = target + d.extra_groups
        else:
            share = len(all_equal) / judged if judged else 0.0
            n = target - len(kept) + extra_groups_for(target - len(kept), share)
        n = min(n, max_groups - dispatched)
        prompts = list(d.more_prompts(dispatched, n))
        result = await run_round(prompts, rounds, enough_informative(target - len(kept), g_size, n))
        results.append(result)
        by: dict[int, list[Sample]] = {}
        for s in result.samples:
            by.setdefault(s.group_id, []).append(s)
        for g in range(n):
            group = by.get(g)
            if not _complete(group, g_size):  # stopped before it finished: never judged, returns to the stream
                continue
            judged += 1
            for s in group:
                s.group_id = dispatched + g  # the iteration's dispatch position: unique over rounds
            if informative(group):
                kept.append(group)
                if len(kept) == target:
                    consumed = dispatched + g + 1
                    break
            else:
                all_equal.append(group)
        dispatched += n
        rounds += 1
    short = 0
    if consumed is None:  # max_groups reached: fill up with all-equal groups, in dispatch order
        consumed = dispatched
        fill = all_equal[: target - len(kept)]
        short = len(fill)
        kept = sorted(kept + fill, key=lambda grp: grp[0].group_id)
    counts = {
        "dynamic_groups_dispatched": dispatched,  # groups issued over every round
        "dynamic_refill_groups": dispatched - target,  # beyond the batch: over-provisioned and refill rounds
        "dynamic_refill_rounds": rounds - 1,  # rounds after the first (each starts after the one before)
        "dynamic_groups_judged": judged,  # complete groups whose rewards were looked at
        "dynamic_all_equal_groups": len(all_equal),  # judged all-equal: dropped (and replaced, unless short)
        "dynamic_short_groups": short,  # all-equal groups kept because max_groups was reached
        "prompts_consumed": consumed,  # how far the prompt cursor moves
    }
    return DynamicOutcome([s for grp in kept for s in grp], results, counts)


def merge_results(results: Sequence[RolloutResult]) -> RolloutResult:
    """Several rounds of one iteration as one result, for the iteration's stats: every chunk and
    telemetry sample, from the first round's start to the last round's end."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    return RolloutResult(
        policy=first.policy,
        samples=[s for r in results for s in r.samples],
        chunks=[c for r in results for c in r.chunks],
        telemetry=[t for r in results for t in r.telemetry],
        start_time=first.start_time,
        end_time=results[-1].end_time,
        policy_summary=first.policy_summary,
        dropped=[x for r in results for x in r.dropped],
        unfinished=[u for r in results for u in r.unfinished],
        env_waits=[w for r in results for w in r.env_waits],
    )


async def run_rounds(req: RolloutRequest, run_round: RoundRunner) -> tuple[RolloutResult, list[Sample], dict]:
    """A rollout's rounds: one (`req.dynamic` unset: every sample, no counts) or dynamic sampling's;
    (the rounds as one result for the stats, the batch's samples, the counts for its record)."""
    if req.dynamic is None:
        result = await run_round(list(req.prompts), 0, None)
        return result, result.samples, {}
    outcome = await dynamic_rollout(req, run_round)
    return merge_results(outcome.results), outcome.samples, outcome.counts
