"""Marginal-benefit-aware draft lengths (Seer, Algorithm 1), as pure functions.

Speculation pays only while the time per output token with drafts,
    T_SD(B, g) = (1 - a) * (D(B, g) + T(B, g)) / (1 - a^(g + 1)),
stays below plain decoding, T(B, 1) (a: acceptance rate, g: draft length, B: batch size, D: draft
time, T: the target's forward time). The best uniform length g* gives a token budget g* * B; that
budget is then shared between the high-priority requests (the groups' probe requests, which hold up
the long tail) and the others, one draft position at a time, by comparing marginal benefits taken
from the online per-position acceptance probabilities ``beta`` (beta[0] = 1, non-increasing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

StepTime = Callable[[int, int], float]  # (batch size B, draft length g) -> seconds


@dataclass(frozen=True)
class DraftLengths:
    """Draft tokens per request for each priority class (0: no speculation); ``max_rows`` caps
    how many rows get them (an exploration step drafts for one row, not the whole batch)."""

    high: int
    low: int
    max_rows: int | None = None


def tokens_per_step(accept_rate: float, draft_len: int) -> float:
    """Expected tokens emitted per verification step: (1 - a^(g+1)) / (1 - a)."""
    if accept_rate >= 1.0:
        return float(draft_len + 1)
    return (1.0 - accept_rate ** (draft_len + 1)) / (1.0 - accept_rate)


def time_per_token(
    accept_rate: float, batch: int, draft_len: int, draft_time: StepTime, verify_time: StepTime
) -> float:
    """T_SD(B, g): seconds per output token of a request with draft length g."""
    step = draft_time(batch, draft_len) + verify_time(batch, draft_len)
    return step / tokens_per_step(accept_rate, draft_len)


def best_draft_length(
    accept_rate: float, batch: int, draft_time: StepTime, verify_time: StepTime, gamma_max: int
) -> int:
    """g* = argmin_g T_SD(B, g) over 1..gamma_max, or 0 when no g beats plain decoding T(B, 1)."""
    plain = verify_time(batch, 0)
    best_g, best_t = 0, plain
    for g in range(1, gamma_max + 1):
        t = time_per_token(accept_rate, batch, g, draft_time, verify_time)
        if t < best_t:
            best_g, best_t = g, t
    return best_g


def allocate_draft_lengths(
    n_high: int,
    n_low: int,
    beta: Sequence[float],
    budget: int,
    gamma_max: int = 8,
    lam: float = 2.0,
) -> DraftLengths:
    """Algorithm 1's loop: share ``budget`` draft tokens between n_high and n_low requests.

    No speculation when the budget cannot give every high-priority request one token. Otherwise
    start at (1, 0) and give one more position to the high-priority requests while
    lam * n_high * (beta[g_h] - beta[g_h + 1]) > n_low * (beta[g_l] - beta[g_l + 1]) (the paper's
    test: lam weighs the probes' marginal benefit, so lam > 1 favours them, lam = 2 by default, and
    lam = 1 is the plain comparison), else to the low-priority ones, until the budget or
    gamma_max stops both. ``beta`` must cover positions 0..gamma_max + 1 (missing tail = 0).
    """
    if n_high < 0 or n_low < 0 or budget < 0 or gamma_max < 0:
        raise ValueError("counts, budget and gamma_max must be >= 0")

    def b(i: int) -> float:
        return beta[i] if i < len(beta) else 0.0

    if n_high + n_low == 0 or gamma_max == 0:
        return DraftLengths(0, 0)
    if n_high == 0:
        g_low = min(gamma_max, budget // n_low)
        return DraftLengths(0, g_low)
    if budget < n_high:
        return DraftLengths(0, 0)
    g_high, g_low = 1, 0
    used = n_high
    while True:
        can_high = g_high < gamma_max and used + n_high <= budget
        can_low = n_low > 0 and g_low < gamma_max and used + n_low <= budget
        gain_high = lam * n_high * (b(g_high) - b(g_high + 1))
        gain_low = n_low * (b(g_low) - b(g_low + 1))
        if can_high and (gain_high > gain_low or not can_low):
            g_high += 1
            used += n_high
        elif can_low:
            g_low += 1
            used += n_low
        else:
            return DraftLengths(g_high, g_low)


def expected_tokens(beta: Sequence[float], draft_len: int) -> float:
    """Tokens a row emits per step with ``draft_len`` drafted: 1 + beta[1] + ... + beta[g]
    (beta[i] = P(position i accepted), the bonus token included)."""
    return 1.0 + sum(beta[i] if i < len(beta) else 0.0 for i in range(1, draft_len + 1))


def best_measured_length(beta: Sequence[float], batch: int, step_time: StepTime, gamma_max: int,
                         min_gain: float = 0.0) -> int:
    """The g in 0..gamma_max that maximises a batch's tokens per second, B x E(g) / step_time(B, g),
    from the measured acceptance profile and step costs (the draft time included); the shorter on ties.

    0 unless some g emits tokens faster than not speculating, by more than ``min_gain`` (a share
    of not speculating's rate), so drafting never runs where it cannot pay. For step costs fixed + B x c(g) with c(g) / E(g) >= c(0) (a verified token costs at
    least a plain row's token), the result never increases with B (docs/dgds.md has the argument).
    """
    if batch <= 0:
        return 0
    best_g, best_rate = 0, batch / step_time(batch, 0)
    for g in range(1, gamma_max + 1):
        rate = batch * expected_tokens(beta, g) / step_time(batch, g)
        if rate > best_rate * (1.0 + 1e-12):
            best_g, best_rate = g, rate
    if best_g and best_rate < batch / step_time(batch, 0) * (1.0 + min_gain):
        return 0
    return best_g


def plan_measured(
    n_high: int,
    n_low: int,
    beta: Sequence[float],
    step_time: StepTime,
    gamma_max: int = 8,
    lam: float = 2.0,
    min_gain: float = 0.0,
) -> DraftLengths:
    """Algorithm 1 on measured costs: budget = g* x B with g* from ``best_measured_length`` (0
    unless drafting beats not drafting by ``min_gain``), shared between the classes by
    ``allocate_draft_lengths`` (the same verified tokens, so the same step cost, moved to the rows
    whose next position is likelier accepted, probes first)."""
    batch = n_high + n_low
    g_star = best_measured_length(beta, batch, step_time, gamma_max, min_gain)
    if g_star == 0:
        return DraftLengths(0, 0)
    return allocate_draft_lengths(n_high, n_low, beta, g_star * batch, gamma_max, lam)


def plan_draft_lengths(
    n_high: int,
    n_low: int,
    beta: Sequence[float],
    accept_rate: float,
    draft_time: StepTime,
    verify_time: StepTime,
    gamma_max: int = 8,
    lam: float = 2.0,
) -> DraftLengths:
    """The whole of Algorithm 1: budget = g* x B from the cost model, then allocate it."""
    batch = n_high + n_low
    if batch == 0:
        return DraftLengths(0, 0)
    g_star = best_draft_length(accept_rate, batch, draft_time, verify_time, gamma_max)
    return allocate_draft_lengths(n_high, n_low, beta, g_star * batch, gamma_max, lam)


@dataclass
class AcceptanceStats:
    """Online per-position acceptance probabilities (beta) from verification outcomes.

    ``record(proposed, accepted)`` after each verified draft; beta[i] = P(position i accepted),
    smoothed by an exponential moving average so the estimate follows the policy as it trains.
    """

    gamma_max: int = 8
    decay: float = 0.99

    def __post_init__(self) -> None:
        self._proposed = [0.0] * (self.gamma_max + 2)
        self._accepted = [0.0] * (self.gamma_max + 2)

    def record(self, proposed: int, accepted: int) -> None:
        for i in range(1, min(proposed, self.gamma_max + 1) + 1):
            self._proposed[i] = self._proposed[i] * self.decay + 1.0
            self._accepted[i] = self._accepted[i] * self.decay + (1.0 if i <= accepted else 0.0)

    @property
    def beta(self) -> list[float]:
        out = [1.0]
        for i in range(1, self.gamma_max + 2):
            p = self._accepted[i] / self._proposed[i] if self._proposed[i] > 0 else 0.0
            out.append(min(out[-1], p))  # acceptance of position i implies i - 1
        return out

    @property
    def accept_rate(self) -> float:
        """Per-token acceptance a (position 1's), the input of the throughput model."""
        return self.beta[1]
