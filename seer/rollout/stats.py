"""Iteration statistics: the numbers a rollout system is judged on, derived from raw events.

Pure functions over finish times and per-instance busy intervals, so they are testable on
hand-made timelines and shared by real runs, benchmarks and the simulator; `stats_from_result`
applies them to a scheduler driver's result (every rollout function's stats).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from seer.types import InstanceStats, IterationStats, SpecDecodeCounters

if TYPE_CHECKING:
    from seer.scheduler.driver import RolloutResult


def tail_time(finish_times: Sequence[float], tail_fraction: float = 0.1) -> float:
    """Time spent only on the last `tail_fraction` of requests to finish.

    The last m = max(1, round(f * n)) of n requests to finish are the tail; it starts when the
    (n - m)-th request finishes and ends with the last one: the span during which only the slowest
    requests were still running. A single request has no tail.
    """
    t = sorted(finish_times)
    m = max(1, round(tail_fraction * len(t)))
    if len(t) <= m:
        return 0.0
    return t[-1] - t[len(t) - m - 1]


def union_length(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of [start, end) intervals, clipped to [lo, hi]."""
    spans = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, cur_a, cur_b = 0.0, None, None
    for a, b in spans:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def instance_stats(
    names: Sequence[str],
    busy_intervals: dict[str, list[tuple[float, float]]],
    tokens: dict[str, int],
    preemptions: dict[str, int],
    start: float,
    end: float,
) -> list[InstanceStats]:
    """Busy = some request of ours in flight there; idle = the rest of the iteration's wall time."""
    wall = max(0.0, end - start)
    out = []
    for name in names:
        busy = union_length(busy_intervals.get(name, []), start, end)
        out.append(
            InstanceStats(
                name=name,
                busy_s=busy,
                idle_s=max(0.0, wall - busy),
                output_tokens=int(tokens.get(name, 0)),
                preemptions=int(preemptions.get(name, 0)),
            )
        )
    return out


def iteration_stats(
    iteration: int,
    policy: str,
    start: float,
    end: float,
    finish_times: Sequence[float],
    output_tokens: int,
    instances: list[InstanceStats],
    extra: dict | None = None,
) -> IterationStats:
    wall = max(1e-9, end - start)
    return IterationStats(
        iteration=iteration,
        policy=policy,
        wall_s=end - start,
        output_tokens=output_tokens,
        tokens_per_s=output_tokens / wall,
        tail_s=tail_time(finish_times),
        num_samples=len(finish_times),
        preemptions=sum(i.preemptions for i in instances),
        instances=instances,
        extra=dict(extra or {}),
    )


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
    }
    if result.routing:  # routing replay's counters (seer.scheduler.routing)
        extra["routing"] = result.routing
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
