"""Algorithm 1 on measured costs (no vLLM): injected step costs and acceptance profiles.

The policy drafts g tokens per row only where the batch's expected tokens per second,
B x E(g) / T(B, g), beat not drafting; T(B, g) carries what a step with drafts costs beyond its
tokens (vLLM's rejection-sampler path, drafting), as the step breakdown measured it.
"""

from __future__ import annotations

import math
import random

import pytest

from seer.dgds.policy.adaptive import AdaptiveDraftLength, StepCost, StepModel
from seer.dgds.policy.draft_length import DraftLengths, best_measured_length, expected_tokens, plan_measured

# one CPU core's shape (docs/dgds.md, "Step breakdown"): a fixed step, a cost per verified token,
# a fixed cost of a step with drafts and a little per drafted token and row
CPU = StepModel(fixed=0.008, per_token=0.0002, spec_fixed=0.002, per_draft_token=0.00002, per_drafted_row=0.00003)
BETA = [1.0, 0.6, 0.45, 0.35, 0.25, 0.15, 0.1, 0.05, 0.02, 0.0]


def _rate(beta, b, g, model) -> float:
    return b * expected_tokens(beta, g) / model.step_time(b, g)


def test_expected_tokens_sum_the_profile():
    assert expected_tokens(BETA, 0) == 1.0
    assert expected_tokens(BETA, 2) == pytest.approx(1 + 0.6 + 0.45)
    assert expected_tokens([1.0, 0.5], 4) == pytest.approx(1.5)  # past the profile: never accepted


def test_draft_length_never_increases_with_batch_and_is_zero_where_it_cannot_pay():
    lengths = [best_measured_length(BETA, b, CPU.step_time, 8) for b in range(1, 129)]
    assert all(a >= b for a, b in zip(lengths, lengths[1:])), lengths
    assert lengths[0] >= 2  # one row: the step's fixed cost dominates, drafts are nearly free
    assert lengths[-1] == 0  # 128 rows: every verified token costs as much as a row's
    for b, g in zip(range(1, 129), lengths):
        rates = [_rate(BETA, b, k, CPU) for k in range(9)]
        if g == 0:
            assert max(rates[1:]) <= rates[0] * (1 + 1e-12), b  # no draft length would pay
            assert plan_measured(0, b, BETA, CPU.step_time) == DraftLengths(0, 0)
        else:
            assert rates[g] == max(rates) > rates[0], b  # the best, and better than not drafting
    # where the policy drafts, the whole batch's budget follows: uniform rows get g*
    for b, g in zip(range(1, 129), lengths):
        assert plan_measured(0, b, BETA, CPU.step_time).low == g
        assert plan_measured(b, 0, BETA, CPU.step_time).high == g


def test_a_drafting_steps_fixed_cost_stops_speculation_at_small_acceptance():
    dear = StepModel(fixed=0.008, per_token=0.0002, spec_fixed=0.004)
    low = [1.0, 0.2, 0.05, 0.0]
    assert all(best_measured_length(low, b, dear.step_time, 8) == 0 for b in range(1, 65))
    # the same acceptance without the fixed cost pays at one row
    assert best_measured_length(low, 1, StepModel(0.008, 0.0002).step_time, 8) >= 1
    assert all(best_measured_length([1.0] + [0.0] * 9, b, CPU.step_time, 8) == 0 for b in range(1, 65))


def _random_costs(rng: random.Random) -> tuple[StepModel, list[float]]:
    """A random step-cost model and a random non-increasing acceptance profile."""
    model = StepModel(rng.uniform(1e-3, 0.02), rng.uniform(1e-5, 5e-4), rng.uniform(0, 5e-3),
                      rng.uniform(0, 1e-4), rng.uniform(0, 5e-5))
    beta = [1.0]
    for _ in range(9):
        beta.append(beta[-1] * rng.uniform(0.3, 1.0))
    return model, beta


def test_monotone_in_batch_for_random_costs_and_profiles():
    rng = random.Random(7)
    for _ in range(300):
        model, beta = _random_costs(rng)
        g = [best_measured_length(beta, b, model.step_time, 8) for b in range(1, 97)]
        assert all(x >= y for x, y in zip(g, g[1:])), (model, beta, g)
        # with probes (one per group of 8), the draft tokens per row never increase either
        per_row = []
        for b in range(1, 97):
            nh = math.ceil(b / 8)
            p = plan_measured(nh, b - nh, beta, model.step_time, 8, 2.0)
            per_row.append((nh * p.high + (b - nh) * p.low) / b)
            assert per_row[-1] <= g[b - 1] + 1e-9
        assert all(x >= y - 1e-9 for x, y in zip(g, g[1:]))


def _feed(policy: AdaptiveDraftLength, truth: StepModel, beta, steps: int, rng: random.Random) -> None:
    """Steps of random batches, as a proposer records them: the plan's drafts, shortened as a tree
    shortens them, verified and accepted per the profile, timed by ``truth``."""
    for _ in range(steps):
        b = rng.randint(1, 48)
        plan = policy.lengths(0, b)
        rows = b if plan.max_rows is None else min(b, plan.max_rows)
        drafted = 0
        for _ in range(rows if plan.low else 0):
            d = rng.randint(max(1, plan.low // 2), plan.low)  # the tree's draft may be shorter
            drafted += d
            accepted = 0
            while accepted < d and rng.random() < beta[accepted + 1] / beta[accepted]:
                accepted += 1
            policy.record_verified(d, accepted)
        t = truth.fixed + truth.per_token * (b + drafted)
        if drafted:
            t += truth.spec_fixed + truth.per_draft_token * drafted
        policy.record_step(b + drafted, t, drafted)
        if drafted:
            policy.record_draft(rows, truth.per_drafted_row * rows)


def test_the_online_fit_recovers_injected_costs_and_plans_as_the_truth_would():
    rng = random.Random(3)
    # (a plan per step: the recovery of the costs, not the plan cache, is under test here)
    policy = AdaptiveDraftLength(gamma_max=8, warmup_drafts=32, explore_every=4, replan_every=1,
                                 cost=StepCost(decay=0.995))
    _feed(policy, CPU, BETA, 1500, rng)
    m = policy.cost.model()
    assert m.fixed == pytest.approx(CPU.fixed, rel=0.02)
    assert m.per_token == pytest.approx(CPU.per_token, rel=0.02)
    assert m.spec_fixed == pytest.approx(CPU.spec_fixed, rel=0.1)
    assert m.per_draft_token == pytest.approx(CPU.per_draft_token, abs=5e-6)
    assert m.per_drafted_row == pytest.approx(CPU.per_drafted_row, rel=0.01)
    beta = policy.acceptance.beta
    assert beta[1] == pytest.approx(BETA[1], abs=0.05)
    for b in (1, 2, 4, 8, 16, 32, 64):
        want = best_measured_length(BETA, b, CPU.step_time, 8)
        got = best_measured_length(beta, b, m.step_time, 8)
        assert abs(got - want) <= 1, (b, got, want)
    assert best_measured_length(beta, 64, m.step_time, 8) == 0


def test_exploration_drafts_for_one_or_two_rows_not_the_batch():
    policy = AdaptiveDraftLength(gamma_max=8, warmup_drafts=4, explore_every=4)
    for _ in range(40):  # nothing is ever accepted: drafting cannot pay
        policy.record_verified(8, 0)
        policy.record_step(40, 0.016, 8)
        policy.record_step(32, 0.014, 0)
    plans = [policy.lengths(0, 32) for _ in range(16)]
    explored = [p for p in plans if p.low]
    assert len(explored) == 4 and {p.max_rows for p in explored} == {1, 2}
    assert all(p == DraftLengths(0, 0) for p in plans if not p.low)


def test_a_plan_is_computed_once_per_batch_shape_and_replan_period():
    policy = AdaptiveDraftLength(gamma_max=8, warmup_drafts=4, explore_every=10**9, replan_every=8)
    for _ in range(40):
        policy.record_verified(8, 8)
        policy.record_step(40, 0.016, 8)
        policy.record_step(32, 0.014, 0)
    calls = []
    import seer.dgds.policy.adaptive as adaptive

    real = adaptive.plan_measured
    adaptive.plan_measured = lambda *a: calls.append(a[:2]) or real(*a)
    try:
        plans = [policy.lengths(1, 3) for _ in range(16)] + [policy.lengths(0, 4)]
    finally:
        adaptive.plan_measured = real
    assert calls == [(1, 3)] * 3 + [(0, 4)]  # (1, 3) at steps 1, 8 and 16, then a new shape
    assert len(set(plans[:16])) == 1


def test_a_gain_margin_drafts_only_where_the_model_gains_that_much_and_stays_monotone():
    rng = random.Random(11)
    for _ in range(200):
        model, beta = _random_costs(rng)
        g = [best_measured_length(beta, b, model.step_time, 8, min_gain=0.1) for b in range(1, 97)]
        assert all(x >= y for x, y in zip(g, g[1:])), (model, beta, g)
        for b, gb in zip(range(1, 97), g):
            if gb:
                assert b * expected_tokens(beta, gb) / model.step_time(b, gb) >= 1.1 * b / model.step_time(b, 0)
            else:  # no length gains 10% (the margin-free choice may still draft, for less)
                free = best_measured_length(beta, b, model.step_time, 8)
                assert not free or (b * expected_tokens(beta, free) / model.step_time(b, free)
                                    < 1.1 * b / model.step_time(b, 0))
