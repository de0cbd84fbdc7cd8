"""How long one engine step takes: a linear model fitted to measured vLLM step times.

    t_step(tokens, context) = fixed_s + per_token_s * tokens + per_context_s * context

`tokens` are the positions the step computes (one per decoding request, g + 1 with g draft
tokens), `context` the KV tokens the step attends over (sum over the batch). The form is the
usual roofline split: a fixed per-step cost (launch/scheduling, weight reads), a per-token
compute cost and an attention cost that grows with the context. Prefill is a separate per-token
cost (recompute after preemption, first prompt). Coefficients come from `step_times.json`
(`python -m bench.sim.measure_steps`); the fit error is reported, never assumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

STEP_TIMES = Path(__file__).with_name("step_times.json")


@dataclass(frozen=True)
class StepModel:
    fixed_s: float
    per_token_s: float
    per_context_s: float
    prefill_per_token_s: float
    # Mixture of experts whose weights a step reads only for the experts its tokens were routed to
    # (roofline only; 0 for the measured fit and dense models): reading all routed experts takes
    # `experts_s`, and with `tokens` positions each picking `experts_per_token` of `experts` the
    # step reads the expected share touched, 1 - (1 - k/n)^tokens (uniform routing).
    experts_s: float = 0.0
    experts: int = 0
    experts_per_token: int = 0

    def experts_read_s(self, tokens: float) -> float:
        if not self.experts_s:
            return 0.0
        return self.experts_s * (1.0 - (1.0 - self.experts_per_token / self.experts) ** tokens)

    def step_s(self, tokens: float, context: float) -> float:
        return self.fixed_s + self.experts_read_s(tokens) + self.per_token_s * tokens + self.per_context_s * context

    def prefill_s(self, tokens: float) -> float:
        return self.prefill_per_token_s * tokens

    def parallel(self, ways: int) -> StepModel:
        """An instance spread over `ways` devices (TP/DP): variable costs split, the fixed one does not."""
        return replace(self, per_token_s=self.per_token_s / ways, per_context_s=self.per_context_s / ways,
                       prefill_per_token_s=self.prefill_per_token_s / ways)


@dataclass(frozen=True)
class FitReport:
    model: StepModel
    points: int
    mean_abs_rel_error: float
    max_abs_rel_error: float
    batch_range: tuple[int, int]
    context_range: tuple[float, float]  # total context tokens of the measured steps

    def describe(self) -> str:
        m = self.model
        return (
            f"step = {m.fixed_s * 1e3:.3f} ms + {m.per_token_s * 1e6:.2f} us/token + "
            f"{m.per_context_s * 1e9:.2f} ns/context-token; prefill {m.prefill_per_token_s * 1e6:.2f} us/token. "
            f"Fit on {self.points} measured steps (B {self.batch_range[0]}-{self.batch_range[1]}, context "
            f"{self.context_range[0]:.0f}-{self.context_range[1]:.0f} tokens): mean |rel. error| "
            f"{self.mean_abs_rel_error:.1%}, max {self.max_abs_rel_error:.1%}"
        )


def fit(data: dict) -> FitReport:
    """Non-negative least squares of the decode points on relative error; prefill slope separately."""
    rows = data["decode"]
    b = np.array([r["batch"] for r in rows], dtype=float)
    ctx = np.array([r["batch"] * r["mean_context"] for r in rows], dtype=float)
    y = np.array([r["step_s"] for r in rows], dtype=float)
    a = np.stack([np.ones_like(b), b, ctx], axis=1)
    w = 1.0 / y  # relative error: small steps matter as much as large ones
    coef = _nnls(a * w[:, None], y * w)
    pre = data.get("prefill") or []
    if len(pre) >= 2:
        p = np.array([r["prompt_len"] for r in pre], dtype=float)
        t = np.array([r["wall_s"] for r in pre], dtype=float)
        slope = max(float(np.polyfit(p, t, 1)[0]), 0.0)
    else:
        slope = coef[1]
    model = StepModel(float(coef[0]), float(coef[1]), float(coef[2]), slope)
    pred = a @ coef
    rel = np.abs(pred - y) / y
    return FitReport(model, len(rows), float(rel.mean()), float(rel.max()),
                     (int(b.min()), int(b.max())), (float(ctx.min()), float(ctx.max())))


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0 (a negative cost would be unphysical): drop and refit."""
    active = list(range(a.shape[1]))
    while True:
        sol = np.linalg.lstsq(a[:, active], y, rcond=None)[0]
        if (sol >= 0).all() or len(active) == 1:
            out = np.zeros(a.shape[1])
            out[active] = np.maximum(sol, 0)
            return out
        active.pop(int(np.argmin(sol)))


def load(path: str | Path = STEP_TIMES) -> FitReport:
    return fit(json.loads(Path(path).read_text()))
