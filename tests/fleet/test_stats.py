"""Iteration statistics on hand-made timelines."""

import pytest

from seer.rollout.stats import instance_stats, iteration_stats, tail_time, union_length


def test_tail_time_is_span_of_last_ten_percent():
    # 10 requests: the 9th finishes at 9, the last at 30 → only the last one runs for 21 s
    finish = [1, 2, 3, 4, 5, 6, 7, 8, 9, 30]
    assert tail_time(finish) == pytest.approx(21.0)
    # 20 requests: the 18th finishes at 18; the last two run alone until 50
    finish = list(range(1, 19)) + [40, 50]
    assert tail_time(finish) == pytest.approx(32.0)


def test_tail_time_edge_cases():
    assert tail_time([]) == 0.0
    assert tail_time([5.0]) == 0.0
    assert tail_time([3.0, 1.0, 2.0]) == pytest.approx(1.0)  # order of input does not matter


def test_union_merges_overlaps_and_clips():
    assert union_length([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(4.0)
    assert union_length([(0, 2), (1, 3), (5, 6)], 1.5, 5.5) == pytest.approx(2.0)
    assert union_length([], 0, 10) == 0.0


def test_instance_busy_and_idle_partition_the_wall_time():
    stats = instance_stats(
        ["a", "b"], {"a": [(0, 4), (2, 6)], "b": [(8, 10)]}, {"a": 100}, {"b": 3}, start=0.0, end=10.0
    )
    a, b = stats
    assert (a.busy_s, a.idle_s, a.output_tokens) == (6.0, 4.0, 100)
    assert (b.busy_s, b.idle_s, b.preemptions) == (2.0, 8.0, 3)
    assert b.idle_fraction == pytest.approx(0.8)
    it = iteration_stats(0, "group_rr", 0.0, 10.0, [1.0, 2.0, 10.0], 400, stats)
    assert it.tokens_per_s == pytest.approx(40.0)
    assert it.preemptions == 3 and it.num_samples == 3
