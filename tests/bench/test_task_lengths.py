"""The built-in task's length distribution as bench/task_lengths.py measures it: the long tail
Seer exists for, and lengths that correlate within a group (what context-aware scheduling relies on)."""

from bench.task_lengths import intraclass_correlation, length_stats, reference_lengths


def test_reference_lengths_are_heavy_tailed_and_within_limits():
    stats = length_stats(reference_lengths(prompts=256, group_size=8, seed=0))
    assert stats.tail_ratio >= 8
    assert 100 <= stats.p50 <= 200
    assert stats.max <= 2048


def test_lengths_correlate_within_a_group():
    stats = length_stats(reference_lengths(prompts=128, group_size=8, seed=1))
    assert stats.icc > 0.9
    assert stats.icc_log > 0.9


def test_icc_separates_grouped_from_random_lengths():
    assert intraclass_correlation([[10, 10, 11], [50, 51, 50], [200, 199, 201]]) > 0.99
    assert intraclass_correlation([[10, 200, 50], [200, 10, 50], [50, 10, 200]]) < 0
