"""Algorithm 1 (marginal-benefit-aware draft lengths) as pure functions."""

from __future__ import annotations

import pytest

from seer.dgds.policy.draft_length import (
    AcceptanceStats,
    DraftLengths,
    allocate_draft_lengths,
    best_draft_length,
    plan_draft_lengths,
    time_per_token,
    tokens_per_step,
)

BETA = [1.0, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1, 0.05, 0.02, 0.0]


def test_tokens_per_step_is_the_geometric_sum():
    assert tokens_per_step(0.0, 5) == 1.0
    assert tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert tokens_per_step(1.0, 3) == 4.0


def test_no_draft_when_verification_is_too_expensive():
    # verifying g extra tokens costs as much as g plain steps: speculation never pays
    verify = lambda b, g: 1.0 * (g + 1)  # noqa: E731
    free = lambda b, g: 0.0  # noqa: E731
    assert best_draft_length(0.7, 64, free, verify, 8) == 0
    assert plan_draft_lengths(2, 30, BETA, 0.7, free, verify) == DraftLengths(0, 0)


def test_best_length_grows_with_acceptance():
    verify = lambda b, g: 1.0 + 0.05 * g * b / 32  # noqa: E731
    draft = lambda b, g: 0.01 * g  # noqa: E731
    lo = best_draft_length(0.3, 32, draft, verify, 8)
    hi = best_draft_length(0.9, 32, draft, verify, 8)
    assert 1 <= lo < hi <= 8
    t = [time_per_token(0.9, 32, g, draft, verify) for g in range(1, 9)]
    assert t[hi - 1] == min(t)


def test_budget_below_high_priority_count_means_no_speculation():
    assert allocate_draft_lengths(10, 50, BETA, budget=9) == DraftLengths(0, 0)


def test_probes_get_priority_while_their_marginal_benefit_wins():
    # 2 probes vs 30 others: probes get positions first only while 2*2*(drop) > 30*(drop)
    out = allocate_draft_lengths(2, 30, BETA, budget=200, gamma_max=8, lam=2.0)
    assert out.high >= 1 and out.low >= 1
    assert 2 * out.high + 30 * out.low <= 200
    # with no low-priority requests, probes take everything up to gamma_max
    assert allocate_draft_lengths(4, 0, BETA, budget=1000) == DraftLengths(8, 0)
    # a huge lambda sends the budget to the probes first; lambda 0 sends what is left after the
    # probes' first token to the others first
    assert allocate_draft_lengths(4, 4, BETA, budget=4 + 4 * 8, lam=1e9) == DraftLengths(8, 1)
    assert allocate_draft_lengths(4, 4, BETA, budget=4 + 4 * 8, lam=0.0) == DraftLengths(1, 8)


def test_a_larger_lambda_never_gives_the_probes_fewer_positions():
    for nh, nl, budget in ((2, 30, 200), (3, 12, 60), (1, 7, 40), (4, 4, 36)):
        highs = [allocate_draft_lengths(nh, nl, BETA, budget, 8, lam).high for lam in (0.5, 1.0, 2.0, 4.0, 16.0)]
        assert highs == sorted(highs), (nh, nl, budget, highs)


def test_allocation_follows_the_marginal_test_step_by_step():
    # Replay the rule independently for one case.
    nh, nl, budget, lam, gmax = 3, 12, 60, 2.0, 8
    g_h, g_l, used = 1, 0, nh
    while True:
        ch = g_h < gmax and used + nh <= budget
        cl = g_l < gmax and used + nl <= budget
        if ch and (lam * nh * (BETA[g_h] - BETA[g_h + 1]) > nl * (BETA[g_l] - BETA[g_l + 1]) or not cl):
            g_h, used = g_h + 1, used + nh
        elif cl:
            g_l, used = g_l + 1, used + nl
        else:
            break
    assert allocate_draft_lengths(nh, nl, BETA, budget, gmax, lam) == DraftLengths(g_h, g_l)
    assert used <= budget


def test_acceptance_stats_estimate_per_position_beta():
    stats = AcceptanceStats(gamma_max=4, decay=1.0)
    for _ in range(50):
        stats.record(proposed=4, accepted=2)
        stats.record(proposed=4, accepted=0)
    beta = stats.beta
    assert beta[0] == 1.0
    assert beta[1] == pytest.approx(0.5) and beta[2] == pytest.approx(0.5)
    assert beta[3] == 0.0
    assert beta == sorted(beta, reverse=True)
    assert stats.accept_rate == pytest.approx(0.5)
