import random

import pytest

from seer.tasks.lengths import intraclass_correlation, length_stats, reference_lengths
from seer.tasks.running_sum import RunningSumConfig, generate_problems, score, solve


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
    target_suffix = f"<{p.reference['target']}\n"
    assert all(g.startswith(f"{p.reference['start']}+") and target_suffix in g for g in group)


def test_icc_separates_grouped_from_random_lengths():
    assert intraclass_correlation([[10, 10, 11], [50, 51, 50], [200, 199, 201]]) > 0.99
    assert intraclass_correlation([[10, 200, 50], [200, 10, 50], [50, 10, 200]]) < 0


def _problem():
    return {"start": 37, "target": 60, "steps": 4}


def test_correct_trace_scores_one():
    ref = _problem()
    for seed in range(20):
        assert score(solve(ref, random.Random(seed)), ref) == 1.0


def test_correct_trace_tolerates_surrounding_whitespace():
    assert score("37+9=46<60\n46+9=55<60\n55+9=64>=60\nanswer 64\n", _problem()) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "37+9=46<60\n46+9=56<60\n56+9=65>=60\nanswer 65",  # arithmetic slip in step 2
        "37+9=46<60\n46+9=55>=60\n55+9=64>=60\nanswer 64",  # wrong comparison
        "37+9=46<60\n46+9=55<60\n55+9=64>=60\nanswer 63",  # wrong answer
        "37+9=46<60\n46+9=55<60\n55+9=64>=60",  # no answer (truncated)
        "37+9=46<60\n46+12=58<60\n58+9=67>=60\nanswer 67",  # not a digit
        "37+9=46<61\n46+9=55<61\n55+9=64>=61\nanswer 64",  # wrong target
        "37+9=46<60\n46+9=55<60\n55+9=64>=60\nanswer 64\nanswer 64",  # trailing junk
        "",
    ],
)
def test_flawed_trace_scores_below_one(text):
    assert 0.0 <= score(text, _problem()) < 1.0


def test_partial_credit_grows_with_correct_progress():
    ref = _problem()
    early = score("37+9=47<60", ref)
    late = score("37+9=46<60\n46+9=55<60\n55+9=65>=60\nanswer 65", ref)
    assert early == 0.0
    assert 0.0 < late <= 0.5
