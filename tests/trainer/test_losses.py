"""Loss pieces against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from seer.trainer import losses
from seer.trainer.batching import TrainSequence, collate, plan_micro_batches


def test_grpo_advantages_hand_computed():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3) -> +-0.5*sqrt(3)
    # group 1: rewards 2, 4 -> mean 3, std sqrt(2) -> -+1/sqrt(2)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = losses.grpo_advantages(rewards, groups, eps=0.0)
    a = 0.5 * math.sqrt(3)
    b = 1 / math.sqrt(2)
    assert adv.tolist() == pytest.approx([a, -a, -a, a, -b, b], abs=1e-6)


def test_grpo_advantages_all_equal_and_singleton_groups_are_exactly_zero():
    # 0.1 * 3 does not average back to exactly 0.1 in floating point: the guard must not rely on it
    rewards = torch.tensor([0.1, 0.1, 0.1, 7.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 2, 2])
    adv = losses.grpo_advantages(rewards, groups)
    assert not torch.isnan(adv).any()
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[4] > 0 > adv[5]


def test_grpo_advantages_without_std_normalisation():
    adv = losses.grpo_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([5, 5, 5]), normalize_std=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_aggregation_modes_and_masking():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # token-mean: (1+2+3+4)/4; seq-mean-token-mean: (2 + 4)/2; the 100s are masked out
    assert losses.aggregate(values, mask, "token-mean").item() == pytest.approx(2.5)
    assert losses.aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # a row with no response tokens does not count as a sequence
    values3 = torch.cat([values, torch.full((1, 4), 9.0)])
    mask3 = torch.cat([mask, torch.zeros(1, 4, dtype=torch.long)])
    assert losses.aggregate(values3, mask3, "seq-mean-token-mean").item() == pytest.approx(3.0)


def test_aggregation_over_micro_batches_equals_whole_batch():
    torch.manual_seed(0)
    values = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    for mode in ("token-mean", "seq-mean-token-mean"):
        whole = losses.aggregate(values, mask, mode)
        parts = sum(
            losses.aggregate(values[i : i + 2], mask[i : i + 2], mode, num_tokens=mask.sum(), num_seqs=6.0)
            for i in (0, 2, 4)
        )
        assert parts.item() == pytest.approx(whole.item(), abs=1e-6)


def test_ppo_clip_hand_computed():
    old = torch.zeros(1, 4)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    t = losses.ppo_clip_terms(logprobs, old, adv, clip_eps_low=0.2)
    # A>0, r=1.5: min(1.5, 1.2) -> loss -1.2, clipped. A>0, r=0.5: min(0.5, 0.8) -> -0.5, unclipped.
    # A<0, r=1.1: max(1.1, 1.1) -> 1.1, unclipped. A<0, r=0.5: max(0.5, 0.8) -> 0.8, clipped.
    assert t.loss.tolist()[0] == pytest.approx([-1.2, -0.5, 1.1, 0.8], abs=1e-6)
    assert t.clipped.tolist()[0] == [1.0, 0.0, 0.0, 1.0]
    # clip-higher widens only the upper bound
    t_hi = losses.ppo_clip_terms(logprobs, old, adv, clip_eps_low=0.2, clip_eps_high=0.6)
    assert t_hi.loss[0, 0].item() == pytest.approx(-1.5, abs=1e-6)


def test_ppo_gradient_vanishes_when_clipped():
    lp = torch.log(torch.tensor([[1.5, 1.0]])).requires_grad_(True)
    t = losses.ppo_clip_terms(lp, torch.zeros(1, 2), torch.tensor([[1.0]]))
    t.loss.sum().backward()
    assert lp.grad.tolist()[0] == pytest.approx([0.0, -1.0])


def test_kl_estimators_hand_computed():
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert losses.kl_penalty(lp, ref, "k1").item() == pytest.approx(math.log(2))
    # d = log(0.25/0.5) = -log 2: exp(d) - d - 1 = 0.5 + log 2 - 1
    assert losses.kl_penalty(lp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert losses.kl_penalty(lp, lp, "k3").item() == 0.0


def test_token_logprobs_entropy_and_sft():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0, 0.0]]])
    targets = torch.tensor([[2, 0]])
    lp = losses.token_logprobs(logits, targets)
    assert lp.tolist()[0] == pytest.approx([math.log(0.25), math.log(0.5)])
    assert losses.entropy_from_logits(logits)[0, 0].item() == pytest.approx(math.log(4))
    # temperature 2 turns [log 3, 0, 0, 0] into probabilities sqrt(3) : 1 : 1 : 1
    lp_t = losses.token_logprobs(logits, targets, temperature=2.0)
    assert lp_t[0, 1].item() == pytest.approx(math.log(math.sqrt(3) / (math.sqrt(3) + 3)))
    sft = losses.sft_loss(lp, torch.tensor([[0, 1]]))
    assert sft.item() == pytest.approx(-math.log(0.5))


def test_collate_masks_prompt_and_padding():
    seqs = [
        TrainSequence([1, 2, 3], [4, 5], advantage=1.0, rollout_logprobs=[-0.4, -0.5]),
        TrainSequence([7], [8, 9, 10], advantage=-1.0, rollout_logprobs=[-1.0]),  # wrong length: unknown
    ]
    mb = collate(seqs, [0, 1], pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 10, 0]]
    # targets are tokens 1..; only response tokens are in the mask
    assert mb.targets.tolist() == [[2, 3, 4, 5], [8, 9, 10, 0]]
    assert mb.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert mb.rollout_logprobs[0].tolist() == pytest.approx([0, 0, -0.4, -0.5])
    assert mb.has_rollout_logprobs.tolist() == [True, False]
    assert mb.advantages.tolist() == [[1.0], [-1.0]]


def test_micro_batch_plan_respects_token_budget():
    lengths = [10, 3, 7, 12, 2, 40]
    plans = plan_micro_batches(lengths, max_tokens=24)
    assert sorted(i for p in plans for i in p) == list(range(6))
    for p in plans:
        assert len(p) == 1 or len(p) * max(lengths[i] for i in p) <= 24
    assert [5] in plans  # longer than the budget: alone
