import random

import pytest

from seer.tasks.lengths import intraclass_correlation, length_stats, reference_lengths
from seer.tasks.running_sum import RunningSumConfig, generate_problems, restated_start_line, score, solve


def test_dataset_is_deterministic_in_its_seed():
    a = generate_problems(RunningSumConfig(num_prompts=50, seed=7))
    b = generate_problems(RunningSumConfig(num_prompts=50, seed=7))
    c = generate_problems(RunningSumConfig(num_prompts=50, seed=8))
    assert a == b
    assert a != c


def test_reference_lengths_are_heavy_tailed_and_within_limits():
    stats = length_stats(reference_lengths(prompts=256, group_size=8, seed=0))
    assert stats.tail_ratio >= 8
    assert 100 <= stats.p50 <= 200
    assert stats.max <= 2048


def test_lengths_correlate_within_a_group():
    stats = length_stats(reference_lengths(prompts=128, group_size=8, seed=1))
    assert stats.icc > 0.9
    assert stats.icc_log > 0.9


def test_group_responses_share_structure_without_being_identical():
    p = generate_problems(RunningSumConfig(num_prompts=1, seed=3, median_steps=20, sigma=0.01))[0]
    rng = random.Random(0)
    group = [solve(p.reference, rng) for _ in range(8)]
    assert len(set(group)) == 8
    w = p.reference["width"]
    assert p.text.endswith(f"start={p.reference['total']:0{w}d}\n")
    assert all(g.endswith(f"={0:0{w}d}\n") and g.startswith("-") for g in group)


def test_icc_separates_grouped_from_random_lengths():
    assert intraclass_correlation([[10, 10, 11], [50, 51, 50], [200, 199, 201]]) > 0.99
    assert intraclass_correlation([[10, 200, 50], [200, 10, 50], [50, 10, 200]]) < 0


def _problem():
    return {"total": 20, "steps": 4, "width": 4}


def test_correct_trace_scores_one():
    ref = _problem()
    for seed in range(20):
        assert score(solve(ref, random.Random(seed)), ref) == 1.0


def test_correct_trace_tolerates_surrounding_whitespace():
    assert score("-9=0011\n-9=0002\n-2=0000", _problem()) == 1.0
    assert score("  -9=0011\n-9=0002\n-2=0000\n\n", _problem()) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "-9=0011\n-9=0003\n-3=0000",  # arithmetic slip in step 2
        "-9=0011\n-9=0002",  # stops before zero (truncated)
        "-9=0011\n-9=0002\n-2=0000\n-1=0000",  # goes on after zero
        "-9=0011\n-9=0002\n-2=0000\ndone",  # trailing junk
        "-9=0011\n-12=0000",  # not a digit
        "-0=0020\n-9=0011\n-9=0002\n-2=0000",  # takes away nothing
        "-9=0011\n-9=0002\n-3=-001",  # below zero
        "",
    ],
)
def test_flawed_trace_scores_below_one(text):
    assert 0.0 <= score(text, _problem()) < 1.0


def test_partial_credit_grows_with_correct_progress():
    ref = _problem()
    assert score("-9=0012", ref) == 0.0
    assert score("-9=0011\n-9=0003", ref) == 0.5 * 9 / 20
    assert score("-9=0011\n-9=0002\n-1=0000", ref) == 0.5 * 18 / 20


def test_restating_the_start_line_scores_zero():
    """The warm start's noisy habit costs the whole reward, so GRPO has a clear signal against it."""
    p = generate_problems(RunningSumConfig(num_prompts=1))[0]
    trace = solve(p.reference, random.Random(0))
    assert score(trace, p.reference) == 1.0
    assert restated_start_line(p.reference) == p.text.split("\n")[-2] + "\n"
    assert score(restated_start_line(p.reference) + trace, p.reference) == 0.0
