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
    w = p.reference["width"]
    target_suffix = f"<{p.reference['target']:0{w}d}\n"
    assert all(g.startswith(f"{p.reference['start']:0{w}d}+") and target_suffix in g for g in group)


def test_icc_separates_grouped_from_random_lengths():
    assert intraclass_correlation([[10, 10, 11], [50, 51, 50], [200, 199, 201]]) > 0.99
    assert intraclass_correlation([[10, 200, 50], [200, 10, 50], [50, 10, 200]]) < 0


def _problem():
    return {"start": 37, "target": 60, "steps": 4, "width": 3}


def test_correct_trace_scores_one():
    ref = _problem()
    for seed in range(20):
        assert score(solve(ref, random.Random(seed)), ref) == 1.0


def test_correct_trace_tolerates_surrounding_whitespace():
    assert score("037+9=046<060\n046+9=055<060\n055+9=064>=060\nanswer 064\n", _problem()) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "037+9=046<060\n046+9=056<060\n056+9=065>=060\nanswer 065",  # arithmetic slip in step 2
        "037+9=046<060\n046+9=055>=060\n055+9=064>=060\nanswer 064",  # wrong comparison
        "037+9=046<060\n046+9=055<060\n055+9=064>=060\nanswer 063",  # wrong answer
        "037+9=046<060\n046+9=055<060\n055+9=064>=060",  # no answer (truncated)
        "037+9=046<060\n046+012=058<060\n058+9=067>=060\nanswer 067",  # not a digit
        "037+9=046<061\n046+9=055<061\n055+9=064>=061\nanswer 064",  # wrong target
        "037+9=046<060\n046+9=055<060\n055+9=064>=060\nanswer 064\nanswer 064",  # trailing junk
        "",
    ],
)
def test_flawed_trace_scores_below_one(text):
    assert 0.0 <= score(text, _problem()) < 1.0


def test_partial_credit_grows_with_correct_progress():
    ref = _problem()
    early = score("037+9=047<060", ref)
    late = score("037+9=046<060\n046+9=055<060\n055+9=065>=060\nanswer 065", ref)
    assert early == 0.0
    assert 0.0 < late <= 0.5
