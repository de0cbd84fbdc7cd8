"""Online inputs of Algorithm 1 inside an engine: acceptance per position and the step-cost model.

``draft_length`` holds the policy as pure functions; they need beta (per-position acceptance),
the acceptance rate, and the cost of a verification step T(B, g) and of drafting D(B, g). An engine
only observes these as it runs, so ``AdaptiveDraftLength`` learns them from what a proposer sees:
how many of its drafted tokens were accepted (``record_verified``), how long one engine step took
for how many verified tokens (``record_step``), and how long drafting took (``record_draft``).

Two guards keep the policy from locking itself out: until ``warmup_drafts`` drafts were verified
it drafts ``gamma_max`` (beta is unknown, and a policy that never speculates never learns it), and
when the cost model says "do not speculate" it still drafts every ``explore_every`` steps so that
beta follows a policy whose outputs change every iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seer.dgds.policy.draft_length import AcceptanceStats, DraftLengths, plan_draft_lengths


@dataclass
class StepCost:
    """T(B, g) = fixed + per_token * B * (g + 1), fitted online (exponentially weighted least
    squares of step seconds against the tokens the step verified), plus a per-request draft time.

    Before enough distinct batch shapes are seen the slope is unknown; ``prior_token_share``
    (the share of a one-token step that each token costs) stands in, so a tiny batch on a big
    model still sees that longer drafts are not free.
    """

    decay: float = 0.98
    prior_token_share: float = 0.05
    _n: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0
    _draft_s_per_req: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        d = self.decay
        self._n = self._n * d + 1.0
        self._sx = self._sx * d + tokens
        self._sy = self._sy * d + seconds
        self._sxx = self._sxx * d + tokens * tokens
        self._sxy = self._sxy * d + tokens * seconds

    def observe_draft(self, requests: int, seconds: float) -> None:
        if requests > 0 and seconds >= 0:
            per = seconds / requests
            self._draft_s_per_req = per if self._draft_s_per_req == 0 else 0.9 * self._draft_s_per_req + 0.1 * per

    def coefficients(self) -> tuple[float, float]:
        """(fixed seconds, seconds per verified token)."""
        if self._n <= 0:
            return 1.0, self.prior_token_share
        mean_x, mean_y = self._sx / self._n, self._sy / self._n
        var = self._sxx / self._n - mean_x * mean_x
        if var > 1e-9 * max(1.0, mean_x * mean_x) and self._n >= 8:
            slope = max(0.0, (self._sxy / self._n - mean_x * mean_y) / var)
            fixed = max(0.0, mean_y - slope * mean_x)
        else:
            per_step = mean_y / (1.0 + self.prior_token_share * max(mean_x - 1.0, 0.0))
            slope = per_step * self.prior_token_share
            fixed = max(0.0, mean_y - slope * mean_x)
        if fixed == 0.0 and slope == 0.0:
            fixed = 1.0
        return fixed, slope

    def verify_time(self, batch: int, draft_len: int) -> float:
        fixed, slope = self.coefficients()
        return fixed + slope * batch * (draft_len + 1)

    def draft_time(self, batch: int, draft_len: int) -> float:
        return 0.0 if draft_len == 0 else self._draft_s_per_req * batch


@dataclass
class AdaptiveDraftLength:
    """Per-step draft lengths for the high- and low-priority rows of a batch (Algorithm 1)."""

    gamma_max: int = 8
    lam: float = 2.0
    warmup_drafts: int = 32
    explore_every: int = 16
    acceptance: AcceptanceStats = field(default=None)  # type: ignore[assignment]
    cost: StepCost = field(default_factory=StepCost)
    _verified: int = 0
    _steps: int = 0

    def __post_init__(self) -> None:
        if self.acceptance is None:
            self.acceptance = AcceptanceStats(gamma_max=self.gamma_max)

    def record_verified(self, proposed: int, accepted: int) -> None:
        """A draft of ``proposed`` tokens was verified and its first ``accepted`` were kept."""
        if proposed > 0:
            self.acceptance.record(proposed, max(0, min(accepted, proposed)))
            self._verified += 1

    def record_step(self, verified_tokens: int, seconds: float) -> None:
        self.cost.observe(verified_tokens, seconds)

    def record_draft(self, requests: int, seconds: float) -> None:
        self.cost.observe_draft(requests, seconds)

    def lengths(self, n_high: int, n_low: int) -> DraftLengths:
        self._steps += 1
        if self._verified < self.warmup_drafts:
            return DraftLengths(self.gamma_max if n_high else 0, self.gamma_max if n_low else 0)
        plan = plan_draft_lengths(
            n_high, n_low, self.acceptance.beta, self.acceptance.accept_rate,
            self.cost.draft_time, self.cost.verify_time, self.gamma_max, self.lam,
        )
        if plan.high == 0 and plan.low == 0 and self._steps % self.explore_every == 0:
            return DraftLengths(self.gamma_max if n_high else 0, self.gamma_max if n_low else 0)
        return plan
