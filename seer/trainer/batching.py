"""Turn token sequences into padded micro-batches whose size is bounded in tokens.

Long RL responses make memory a function of tokens, not of sequence count, so a micro-batch is
filled while ``rows * longest_row <= max_tokens`` (padded tokens, what activations really cost).
Sequences are sorted by length first to keep padding low; a sequence longer than the budget gets
a micro-batch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainSequence:
    """One prompt + response to train on, with its sequence-level advantage."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float = 0.0
    rollout_logprobs: list[float] | None = None  # one per response token, or None when unknown

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class MicroBatch:
    """Padded tensors for a few sequences; per-token tensors are [B, S-1], aligned with targets."""

    indices: list[int]  # position of each row in the caller's sequence list
    input_ids: torch.Tensor  # [B, S] long, right-padded
    targets: torch.Tensor  # [B, S-1] long: input_ids shifted left by one
    mask: torch.Tensor  # [B, S-1] float: 1 on response-token targets only
    advantages: torch.Tensor  # [B, 1] float
    rollout_logprobs: torch.Tensor  # [B, S-1] float, 0 where unknown
    has_rollout_logprobs: torch.Tensor  # [B] bool
    old_logprobs: torch.Tensor | None = None  # filled in by the trainer before the update

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum().item())

    def to(self, device: torch.device) -> MicroBatch:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return MicroBatch(**moved)


def collate(seqs: list[TrainSequence], indices: list[int], pad_id: int = 0) -> MicroBatch:
    """Right-pad ``seqs`` into one MicroBatch; targets at j are tokens at j+1."""
    width = max(s.length for s in seqs)
    b = len(seqs)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width - 1), dtype=torch.float32)
    rollout = torch.zeros((b, width - 1), dtype=torch.float32)
    has_rollout = torch.zeros(b, dtype=torch.bool)
    for row, s in enumerate(seqs):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p == 0:
            raise ValueError("a training sequence needs at least one prompt token")
        input_ids[row, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        # response token k sits at position p+k and is predicted from position p+k-1
        mask[row, p - 1 : p - 1 + r] = 1.0
        if s.rollout_logprobs is not None and len(s.rollout_logprobs) == r:
            rollout[row, p - 1 : p - 1 + r] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
            has_rollout[row] = True
    return MicroBatch(
        indices=list(indices),
        input_ids=input_ids,
        targets=input_ids[:, 1:].clone(),
        mask=mask,
        advantages=torch.tensor([[s.advantage] for s in seqs], dtype=torch.float32),
        rollout_logprobs=rollout,
        has_rollout_logprobs=has_rollout,
    )


def plan_micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices so each group's rows * longest length stays within max_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plans: list[list[int]] = []
    for i in order:
        # sorted descending, so the first row of a group is its longest
        if plans and (len(plans[-1]) + 1) * lengths[plans[-1][0]] <= max_tokens:
            plans[-1].append(i)
        else:
            plans.append([i])
    return plans


def make_micro_batches(seqs: list[TrainSequence], max_tokens: int, pad_id: int = 0) -> list[MicroBatch]:
    plans = plan_micro_batches([s.length for s in seqs], max_tokens)
    return [collate([seqs[i] for i in plan], plan, pad_id) for plan in plans]
