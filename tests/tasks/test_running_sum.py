import random

import pytest

from seer.tasks.running_sum import RunningSumConfig, generate_problems, restated_start_line, score, solve


def test_dataset_is_deterministic_in_its_seed():
    a = generate_problems(RunningSumConfig(num_prompts=50, seed=7))
    b = generate_problems(RunningSumConfig(num_prompts=50, seed=7))
    c = generate_problems(RunningSumConfig(num_prompts=50, seed=8))
    assert a == b
    assert a != c


def test_group_responses_share_structure_without_being_identical():
    p = generate_problems(RunningSumConfig(num_prompts=1, seed=3, median_steps=20, sigma=0.01))[0]
    rng = random.Random(0)
    group = [solve(p.reference, rng) for _ in range(8)]
    assert len(set(group)) == 8
    w = p.reference["width"]
    assert p.text.endswith(f"start={p.reference['total']:0{w}d}\n")
    assert all(g.endswith(f"={0:0{w}d}\n") and g.startswith("-") for g in group)


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
