"""GRPO / PPO / SFT losses as pure tensor functions.

Everything here is shape-in, shape-out with no model, optimizer or global state, so each piece
can be checked against hand-computed numbers. Per-token tensors share one layout: ``[batch, T]``
aligned with the *targets* (token t+1 predicted at position t), and a boolean/0-1 ``mask`` of the
same shape that is 1 only on response tokens (prompt tokens and padding are 0).

Aggregation takes optional global normalisers (``num_tokens`` / ``num_seqs``) so that a loss summed
over micro-batches with gradient accumulation equals the loss of the whole mini-batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seer.trainer.config import AggMode, KLEstimator, TrainerConfig  # noqa: F401  (AggMode, KLEstimator: re-exported)


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-normalised advantages for tensors of rewards and group ids: the registry's `grpo`
    ((r - mean_g) / (std_g + eps), unbiased std; all-equal and one-sample groups exactly 0), or with
    ``normalize_std=False`` its `dr_grpo` (mean-only). seer.trainer.algorithms holds the formulas.
    """
    from seer.trainer.algorithms import Group, dr_grpo, grpo

    ids = group_ids.tolist()
    order = list(dict.fromkeys(ids))
    members = {g: [i for i, x in enumerate(ids) if x == g] for g in order}
    values = rewards.to(torch.float64).tolist()
    groups = [Group(tuple(values[i] for i in members[g])) for g in order]
    per_group = grpo(groups, eps=eps) if normalize_std else dr_grpo(groups)
    adv = [0.0] * len(ids)
    for g, a in zip(order, per_group):
        for i, v in zip(members[g], a):
            adv[i] = v
    return torch.tensor(adv, dtype=torch.float32)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature); logits [B, T, V], targets [B, T] -> [B, T].

    Computed in fp32: bf16 log-softmax alone produces logprob errors larger than the
    train-inference mismatch we want to measure.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token entropy of softmax(logits / temperature); [B, T, V] -> [B, T]."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar over masked (response) tokens.

    token-mean: sum over every response token / number of response tokens (long responses weigh
    more). seq-mean-token-mean: mean within each sequence, then mean over sequences (each response
    weighs the same). ``num_tokens`` / ``num_seqs`` override the local denominators with the
    mini-batch totals when this call sees only one micro-batch of it.
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=values.dtype)
        return (values * mask).sum() / denom.clamp_min(1.0)
    if mode == "seq-mean-token-mean":
        per_seq_tokens = mask.sum(-1)
        has_tokens = per_seq_tokens > 0
        per_seq = (values * mask).sum(-1) / per_seq_tokens.clamp_min(1.0)
        denom = has_tokens.sum().to(values.dtype) if num_seqs is None else torch.as_tensor(num_seqs, dtype=values.dtype)
        return (per_seq * has_tokens).sum() / denom.clamp_min(1.0)
    raise ValueError(f"unknown aggregation mode {mode!r}")


@dataclass
class PolicyLossTerms:
    """Per-token pieces of the clipped objective, left unreduced so callers choose the aggregation."""

    loss: torch.Tensor  # [B, T] the PPO pessimistic surrogate, to be minimised
    clipped: torch.Tensor  # [B, T] 1.0 where the clipped branch is the active one
    ratio: torch.Tensor  # [B, T] pi / pi_old


def ppo_clip_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps_low: float = TrainerConfig.clip_eps_low,
    clip_eps_high: float | None = None,
) -> PolicyLossTerms:
    """PPO clipped surrogate per token: max(-A r, -A clip(r, 1-eps_low, 1+eps_high)).

    ``advantages`` broadcasts against [B, T] (pass [B, 1] for one advantage per sequence).
    ``clip_eps_high`` defaults to ``clip_eps_low``; a larger one is DAPO's clip-higher.
    """
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + high)
    return PolicyLossTerms(
        loss=torch.maximum(unclipped, clipped),
        clipped=(clipped > unclipped).to(logprobs.dtype),
        ratio=ratio,
    )


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1 / k3).

    k1 = log pi - log pi_ref is unbiased but can be negative; k3 = exp(d) - d - 1 with
    d = log pi_ref - log pi is unbiased, non-negative and lower-variance (GRPO's choice).
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}")


def sft_loss(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Supervised negative log-likelihood over response tokens (warm starts)."""
    return aggregate(-logprobs, mask, mode, num_tokens=num_tokens, num_seqs=num_seqs)
