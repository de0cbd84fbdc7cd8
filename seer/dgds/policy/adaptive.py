"""Online inputs of Algorithm 1 inside an engine: acceptance per position and the step-cost model.

``draft_length`` holds the policy as pure functions; they need beta (per-position acceptance),
the acceptance rate, and the cost of a verification step T(B, g) and of drafting D(B, g). An engine
only observes these as it runs, so ``AdaptiveDraftLength`` learns them from what a proposer sees:
how many of its drafted tokens were accepted (``record_verified``), how long one engine step took
for how many verified tokens (``record_step``), and how long drafting took (``record_draft``).

The policy (``draft_length.plan_measured``) drafts only where the batch's expected tokens per
second, B x E(g) / T(B, g), rise above not drafting, with E from the measured per-position
acceptance and T from the fitted step costs, a step with drafts' own fixed cost included.

Two guards keep the policy from locking itself out: until ``warmup_drafts`` drafts were verified
it drafts ``gamma_max`` (beta is unknown, and a policy that never speculates never learns it), and
when the cost model says "do not speculate" it still drafts, for one or two rows, every
``explore_every`` (32) steps, so that beta and the cost of drafting follow a policy whose outputs
change every iteration, at a few verified tokens per exploring step instead of a whole batch's.

A plan is a function of the batch's two counts, beta and the fit, and the last two move slowly
(exponential averages over tens of steps), so a plan is computed once per batch shape and
``replan_every`` steps, not every step: refitting T(B, g) and evaluating every g per step was
most of what a zero-draft step cost the proposer (docs/dgds.md, "Step breakdown").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seer.dgds.policy.draft_length import AcceptanceStats, DraftLengths, plan_measured


@dataclass(frozen=True)
class StepModel:
    """A step's cost, T(B, g) = fixed + per_token x B x (g + 1) + [g > 0] x (spec_fixed +
    per_draft_token x B x g + per_drafted_row x B): the forward's tokens, and what a step with
    drafts adds (vLLM's rejection-sampler path, the proposer's drafting)."""

    fixed: float
    per_token: float
    spec_fixed: float = 0.0
    per_draft_token: float = 0.0
    per_drafted_row: float = 0.0

    def step_time(self, batch: int, draft_len: int) -> float:
        t = self.fixed + self.per_token * batch * (draft_len + 1)
        if draft_len > 0:
            t += self.spec_fixed + (self.per_draft_token * draft_len + self.per_drafted_row) * batch
        return t


_FEATURES = 4  # 1, verified tokens, draft tokens, "the step verified drafts"


def _solve(a: list[list[float]], b: list[float], active: list[int]) -> list[float]:
    """Least squares normal equations restricted to ``active`` coefficients (Gauss-Jordan)."""
    n = len(active)
    m = [[a[i][j] for j in active] + [b[i]] for i in active]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            return [0.0] * _FEATURES
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    out = [0.0] * _FEATURES
    for i, j in enumerate(active):
        out[j] = m[i][n] / m[i][i]
    return out


@dataclass
class StepCost:
    """T(B, g), fitted online: exponentially weighted least squares of engine-step seconds
    against (1, verified tokens, draft tokens, the step verified drafts), every coefficient >= 0,
    plus a per-row drafting time measured around the proposer's drafting call.

    The draft terms are what a speculating step costs beyond its tokens (vLLM's rejection
    sampler and the bookkeeping of drafts, docs/dgds.md "Step breakdown"); a small ridge keeps
    them at 0 until steps with and without drafts were both seen. Before distinct batch shapes
    are seen the token slope is unknown; ``prior_token_share`` (the share of a one-token step that
    each token costs) stands in, so a tiny batch on a big model still sees that drafts are not free.
    """

    decay: float = 0.98
    prior_token_share: float = 0.05
    ridge: float = 1e-3
    _n: float = 0.0
    _sy: float = 0.0
    _xx: list = field(default_factory=lambda: [[0.0] * _FEATURES for _ in range(_FEATURES)])
    _xy: list = field(default_factory=lambda: [0.0] * _FEATURES)
    _draft_s_per_req: float = 0.0
    _model: StepModel | None = None

    def observe(self, tokens: int, seconds: float, draft_tokens: int = 0) -> None:
        """One engine step that verified ``tokens`` tokens (rows + ``draft_tokens``) in ``seconds``."""
        if tokens <= 0 or seconds <= 0:
            return
        d = self.decay
        x = (1.0, float(tokens), float(draft_tokens), 1.0 if draft_tokens > 0 else 0.0)
        self._n = self._n * d + 1.0
        self._sy = self._sy * d + seconds
        for i in range(_FEATURES):
            self._xy[i] = self._xy[i] * d + x[i] * seconds
            row = self._xx[i]
            for j in range(_FEATURES):
                row[j] = row[j] * d + x[i] * x[j]
        self._model = None

    def observe_draft(self, requests: int, seconds: float) -> None:
        if requests > 0 and seconds >= 0:
            per = seconds / requests
            self._draft_s_per_req = per if self._draft_s_per_req == 0 else 0.9 * self._draft_s_per_req + 0.1 * per
            self._model = None

    def model(self) -> StepModel:
        """The current fit (cached until the next sample)."""
        if self._model is None:
            self._model = self._fit()
        return self._model

    def _fit(self) -> StepModel:
        n = self._n
        if n <= 0:
            return StepModel(1.0, self.prior_token_share, per_drafted_row=self._draft_s_per_req)
        mean_x, mean_y = self._xx[0][1] / n, self._sy / n
        var = self._xx[1][1] / n - mean_x * mean_x
        if not (var > 1e-9 * max(1.0, mean_x * mean_x) and n >= 8):
            # one batch shape so far: the slope is the prior share of the mean step
            per_step = mean_y / (1.0 + self.prior_token_share * max(mean_x - 1.0, 0.0))
            slope = per_step * self.prior_token_share
            return StepModel(max(0.0, mean_y - slope * mean_x) or 1.0, slope,
                             per_drafted_row=self._draft_s_per_req)
        a = [row[:] for row in self._xx]
        # ridge on the draft terms only (a pseudo-sample of weight ridge x n at 0), so they stay 0
        # until steps with and without drafts were both seen; scaled to the feature's size
        a[2][2] += self.ridge * n * mean_x * mean_x
        a[3][3] += self.ridge * n
        active = list(range(_FEATURES))
        while True:
            coef = _solve(a, self._xy, active)
            neg = [j for j in active if coef[j] < 0]
            if not neg:
                break
            active.remove(min(neg, key=lambda j: coef[j]))
            if not active:
                coef = [0.0] * _FEATURES
                break
        fixed, slope, per_draft, spec_fixed = coef
        if fixed == 0.0 and slope == 0.0:
            fixed = mean_y or 1.0
        return StepModel(fixed, slope, spec_fixed, per_draft, self._draft_s_per_req)

    def coefficients(self) -> tuple[float, float]:
        """(fixed seconds, seconds per verified token)."""
        m = self.model()
        return m.fixed, m.per_token

    def verify_time(self, batch: int, draft_len: int) -> float:
        m = self.model()
        t = m.fixed + m.per_token * batch * (draft_len + 1)
        if draft_len > 0:
            t += m.spec_fixed + m.per_draft_token * batch * draft_len
        return t

    def draft_time(self, batch: int, draft_len: int) -> float:
        return 0.0 if draft_len == 0 else self._draft_s_per_req * batch

    def step_time(self, batch: int, draft_len: int) -> float:
        """T(B, g) + D(B, g): the whole step with drafting (what the policy compares)."""
        return self.model().step_time(batch, draft_len)


@dataclass
class AdaptiveDraftLength:
    """Per-step draft lengths for the high- and low-priority rows of a batch (Algorithm 1)."""

    gamma_max: int = 8
    lam: float = 2.0
    warmup_drafts: int = 32
    explore_every: int = 32
    replan_every: int = 8
    # Draft only where the model's gain is at least this share: around break-even a drafting step
    # loses to what the fit does not see (the drafted positions' KV on a KV-bound instance, rows
    # that accept less than the mean, such as a rollout's longest request past its siblings; see
    # docs/dgds.md, "Grouped SD on the ladder").
    min_gain: float = 0.1
    acceptance: AcceptanceStats = field(default=None)  # type: ignore[assignment]
    cost: StepCost = field(default_factory=StepCost)
    _verified: int = 0
    _steps: int = 0
    _plans: dict = field(default_factory=dict)  # (n_high, n_low) -> plan, since step _planned_at
    _planned_at: int = 0

    def __post_init__(self) -> None:
        if self.acceptance is None:
            self.acceptance = AcceptanceStats(gamma_max=self.gamma_max)

    def record_verified(self, proposed: int, accepted: int) -> None:
        """A draft of ``proposed`` tokens was verified and its first ``accepted`` were kept."""
        if proposed > 0:
            self.acceptance.record(proposed, max(0, min(accepted, proposed)))
            self._verified += 1

    def record_step(self, verified_tokens: int, seconds: float, draft_tokens: int = 0) -> None:
        """One engine step: ``verified_tokens`` (rows + ``draft_tokens``) in ``seconds``."""
        self.cost.observe(verified_tokens, seconds, draft_tokens)

    def record_draft(self, requests: int, seconds: float) -> None:
        self.cost.observe_draft(requests, seconds)

    def lengths(self, n_high: int, n_low: int) -> DraftLengths:
        self._steps += 1
        if self._verified < self.warmup_drafts:
            return DraftLengths(self.gamma_max if n_high else 0, self.gamma_max if n_low else 0)
        if self._steps - self._planned_at >= self.replan_every:
            self._plans.clear()
            self._planned_at = self._steps
        plan = self._plans.get((n_high, n_low))
        if plan is None:
            plan = plan_measured(n_high, n_low, self.acceptance.beta, self.cost.step_time, self.gamma_max, self.lam,
                                 self.min_gain)
            self._plans[(n_high, n_low)] = plan
        if plan.high == 0 and plan.low == 0 and self._steps % self.explore_every == 0:
            # one or two rows, not the batch: an exploring step costs a few verified tokens
            rows = 1 + (self._steps // self.explore_every) % 2
            return DraftLengths(self.gamma_max if n_high else 0, self.gamma_max if n_low else 0, max_rows=rows)
        return plan
