"""Grouped speculative decoding in the simulator: acceptance from group references, Algorithm 1's lengths.

Acceptance is not invented: it comes from a measured table of mean acceptance length vs the
number of group references n (the paper's Table 2 for paper-scale scenarios, or
`bench/results/dgds_acceptance/dgds_acceptance.json` measured here). A request's n is how many siblings have
already generated past its position, i.e. how many references its group's suffix tree holds for
the tokens it is about to draft. Draft lengths per step come from the project's own Algorithm 1
(`seer.dgds.policy.draft_length.plan_draft_lengths`) over the simulator's step-time model, so
speculation switches itself off at large batches exactly as in the real proposer.

What verifying drafts costs is a parameter, ``SpecCost``: a drafted position's cost and the fixed
cost of a step that verifies drafts, both relative to the step model's fixed cost (the structure
of `bench.spec_breakdown`'s measurement, docs/dgds.md "Step breakdown"). On the paper's H800s
(``SpecCost.roofline()``, the default) a drafted position costs what the roofline prices any
computed position and a drafting step adds nothing fixed; for this machine's CPU instances
``SpecCost.measured(breakdown.json)`` fits both from a recorded breakdown, where a drafted token
costs ~2% of a step's fixed cost and a drafting step ~15% more (the rejection sampler and the
proposer's drafting), which is why speculation pays here only at small batches.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seer.dgds.policy.draft_length import DraftLengths, plan_draft_lengths, tokens_per_step

from seer.sim.step_model import StepModel

# Paper Table 2 (Qwen2-VL-72B), linear drafting: references n -> mean acceptance length.
PAPER_TABLE2_LINEAR: dict[int, float] = {0: 1.70, 1: 2.04, 5: 2.32, 15: 2.53}
DRAFT_US_PER_TOKEN = 3.45e-6  # DGDS speculate cost per drafted token (bench/results/dgds_hotpath/dgds_hotpath.md)


@dataclass(frozen=True)
class SpecCost:
    """What a step that verifies drafts costs beyond its decode positions, relative to the step
    model's fixed cost ``fixed_s``: each drafted (verified) position costs ``verify_token`` x fixed_s
    (None: the step model's ``per_token_s``, as any computed position) and a step with any draft
    ``spec_fixed`` x fixed_s more; ``zero_draft`` x fixed_s is what any step of a speculating
    instance costs over a plain instance's (vLLM's speculative path and the proposer's own work
    when nothing is drafted; docs/dgds.md, "Step breakdown", measures it)."""

    verify_token: float | None = None
    spec_fixed: float = 0.0
    zero_draft: float = 0.0  # what every step of a speculating instance costs more, drafts or not
    source: str = "roofline: a drafted position costs a computed one, no fixed cost"

    def verify_token_s(self, step: StepModel) -> float:
        return step.per_token_s if self.verify_token is None else self.verify_token * step.fixed_s

    def extra_s(self, step: StepModel, drafted: float) -> float:
        """Seconds a speculating instance's step with ``drafted`` draft tokens costs beyond the step
        model's price of its positions (which counts each drafted position at ``per_token_s``)."""
        t = self.zero_draft * step.fixed_s
        if drafted > 0:
            t += self.spec_fixed * step.fixed_s + drafted * (self.verify_token_s(step) - step.per_token_s)
        return t

    @classmethod
    def roofline(cls) -> SpecCost:
        return cls()

    @classmethod
    def measured(cls, path: str | Path) -> SpecCost:
        """Fitted to a recorded ``bench.spec_breakdown`` run's grid (decode steps of the plain and
        the forced-length variants ``spec:g``, g = 0 included): step = F + c x verified +
        [speculating] x Z + [drafts] x S + v x drafted, least squares on relative error, every
        coefficient >= 0; verify_token = (c + v) / F, spec_fixed = S / F, zero_draft = Z / F."""
        f, c, sf, v, z = fit_breakdown(path)
        return cls((c + v) / f, sf / f, z / f,
                   f"measured here ({Path(path).name}: fixed {1e3 * f:.2f} ms, {1e3 * c:.3f} ms per verified token, "
                   f"+{1e3 * v:.3f} ms per drafted token, +{1e3 * sf:.2f} ms per drafting step, "
                   f"+{1e3 * z:.2f} ms per step of a speculating instance)")


def fit_breakdown(path: str | Path) -> tuple[float, float, float, float, float]:
    """(F, c, S, v, Z) in seconds from a ``bench.spec_breakdown`` JSON (see ``SpecCost.measured``)."""
    import numpy as np

    from seer.sim.step_model import _nnls

    rows = [r for r in json.loads(Path(path).read_text())["breakdown"]
            if r["kind"] == "grid" and r.get("steps") and (r["variant"] == "plain" or r["variant"][5:].isdigit())]
    x = np.array([[1.0, r["verified_tokens"], 1.0 if r["variant"] != "plain" else 0.0,
                   1.0 if r["spec_tokens"] > 0 else 0.0, r["spec_tokens"]] for r in rows])
    y = np.array([r["step_ms"] / 1e3 for r in rows])
    f, c, z, sf, v = (float(k) for k in _nnls(x / y[:, None], np.ones_like(y)))
    return f, c, sf, v, z


@functools.lru_cache(maxsize=1024)
def accept_rate_for_length(mean_len: float, draft_len: int) -> float:
    """Per-position acceptance a with (1 - a^(g+1)) / (1 - a) = mean_len (bisection)."""
    if mean_len <= 1.0:
        return 0.0
    lo, hi = 0.0, 0.999999
    for _ in range(60):
        mid = (lo + hi) / 2
        if tokens_per_step(mid, draft_len) < mean_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class AcceptanceTable:
    """Mean acceptance length (bonus included) at `draft_len` per number of group references."""

    lengths: dict[int, float]
    draft_len: int = 8
    source: str = "paper Table 2"

    def accept_rate(self, references: int) -> float:
        """Per-position acceptance for a request with `references` siblings ahead (step interpolation)."""
        keys = sorted(self.lengths)
        i = max(0, bisect.bisect_right(keys, references) - 1)
        return accept_rate_for_length(self.lengths[keys[i]], self.draft_len)

    @classmethod
    def paper(cls) -> AcceptanceTable:
        return cls(dict(PAPER_TABLE2_LINEAR), 8, "paper Table 2 (linear)")

    @classmethod
    def measured(cls, path: str | Path) -> AcceptanceTable:
        d = json.loads(Path(path).read_text())
        lengths = {int(n): float(v["linear"]) for n, v in d["mean_acceptance_length"].items()}
        return cls(lengths, int(d.get("spec_tokens", 8)), f"measured here ({Path(path).name})")


def attention_multiplier(positions: int, ridge_positions: float) -> float:
    """Attention time with `positions` query positions per request, relative to one.

    Decode attention reads each context token's KV once per step whatever the number of query
    positions, and computes on it once per position: memory-bound (1x) while the positions stay
    below the GPU's ridge point for the model's attention (`seer.sim.hardware.
    attention_ridge_positions`), compute-bound (positions / ridge) beyond it.
    """
    return max(1.0, positions / ridge_positions)


def plan(step: StepModel, unit: int, context: float, high: Sequence[float], low: Sequence[float],
         gamma_max: int = 8, lam: float = 2.0, ridge_positions: float = math.inf,
         spec: SpecCost = SpecCost()) -> DraftLengths:
    """Algorithm 1 for one step of one instance (rates of the probe and other requests).

    The cost model is the simulator's own step model: verifying g drafts for B requests computes
    B * (g + 1) positions and attends over the batch's context at the attention multiplier of
    g + 1 positions, plus what ``spec`` says verifying drafts adds; drafting costs the DGDS lookup
    per drafted token. The batch's context enters
    in 1% buckets (as a real planner reads a profiled cost table), so that a plan is computed once
    per batch composition and bucket: it runs once per rank per event, the simulator's hot path.
    """
    if not high and not low:
        return DraftLengths(0, 0)
    # Rates take a few distinct values (Table 2's rows): the batch is its counts of each.
    counts = Counter(high)
    counts.update(low)
    bucket = round(math.log(max(context * unit, 1.0)) / CONTEXT_BUCKET) if context > 0 else -1
    return _plan(step, unit, bucket, len(high), len(low), tuple(sorted(counts.items())), gamma_max, lam,
                 ridge_positions, spec)


CONTEXT_BUCKET = math.log(1.01)  # the planner's context resolution: 1%


@functools.lru_cache(maxsize=1 << 16)
def _plan(step: StepModel, unit: int, bucket: int, n_high: int, n_low: int, counts: tuple[tuple[float, int], ...],
          gamma_max: int, lam: float, ridge_positions: float, spec: SpecCost = SpecCost()) -> DraftLengths:
    n = n_high + n_low
    beta = [sum(c * r ** i for r, c in counts) / n for i in range(gamma_max + 2)]  # beta[i] = mean a^i
    a = beta[1]
    ctx = math.exp(bucket * CONTEXT_BUCKET) if bucket >= 0 else 0.0  # real tokens
    attn = [attention_multiplier(g + 1, ridge_positions) for g in range(gamma_max + 1)]

    def verify(b: int, g: int) -> float:
        return step.step_s(b * (g + 1) * 1.0, ctx * attn[g]) + spec.extra_s(step, b * g)

    def draft(b: int, g: int) -> float:
        return b * g * DRAFT_US_PER_TOKEN

    return plan_draft_lengths(n_high, n_low, beta, a, draft, verify, gamma_max, lam)
