"""GRPO steps on a toy batch move probability towards the rewarded responses."""

from __future__ import annotations

import math

import pytest

from seer.types import IterationStats, PromptSpec, RolloutBatch, Sample
from seer.trainer import SFTExample, Trainer, TrainerConfig

PROMPT = [1, 2, 3, 4]
GOOD = [[5, 6, 7], [5, 6, 8]]  # rewarded
BAD = [[9, 10, 11, 12], [13, 14]]  # not rewarded


def make_batch(trainer: Trainer, responses: list[list[int]], rewards: list[float], group_id: int = 0,
               logprob_shift: float = 0.0) -> RolloutBatch:  # fmt: skip
    """A one-group rollout whose logprobs are the trainer's own (as an exact inference engine's)."""
    prompt = PromptSpec(index=group_id, text="", prompt_ids=PROMPT, reference={})
    lps = trainer.score([PROMPT] * len(responses), responses)
    samples = [
        Sample(group_id=group_id, sample_index=i, request_id=f"{group_id}-{i}", prompt=prompt, response_ids=r,
               logprobs=[x + logprob_shift for x in lp], finish_reason="stop", start_time=0.0, finish_time=0.0,
               instances=["i0"], reward=rw)
        for i, (r, lp, rw) in enumerate(zip(responses, lps, rewards))
    ]  # fmt: skip
    stats = IterationStats(iteration=0, policy="test", wall_s=0.0, output_tokens=0, tokens_per_s=0.0, tail_s=0.0,
                           num_samples=len(samples), preemptions=0)  # fmt: skip
    return RolloutBatch(samples=samples, stats=stats)


def seq_logprob(trainer: Trainer, response: list[int]) -> float:
    return sum(trainer.score([PROMPT], [response])[0])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_grpo_steps_raise_logprob_of_rewarded_responses(tiny_qwen2, agg):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=3e-3, loss_agg=agg, max_tokens_per_micro_batch=16))
    responses, rewards = GOOD + BAD, [1.0, 1.0, 0.0, 0.0]
    before = {tuple(r): seq_logprob(trainer, r) for r in responses}
    for step in range(3):
        m = trainer.train_step(make_batch(trainer, responses, rewards))
        assert m.iteration == step + 1
        assert m.tokens == sum(map(len, responses)) and m.sequences == 4
        assert m.grad_norm > 0 and math.isfinite(m.loss)
        assert m.logprob_mismatch_max < 1e-4  # rollout logprobs were computed from these weights
    after = {tuple(r): seq_logprob(trainer, r) for r in responses}
    for r in GOOD:
        assert after[tuple(r)] > before[tuple(r)] + 0.5
    for r in BAD:
        assert after[tuple(r)] < before[tuple(r)] - 0.5


def test_all_equal_rewards_leave_the_policy_unchanged(tiny_qwen2):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=3e-3))
    responses = GOOD + BAD
    before = [seq_logprob(trainer, r) for r in responses]
    m = trainer.train_step(make_batch(trainer, responses, [1.0] * 4))
    assert m.zero_adv_fraction == 1.0 and m.grad_norm == 0.0
    assert [seq_logprob(trainer, r) for r in responses] == pytest.approx(before, abs=1e-6)


def test_mismatch_metric_reports_the_rollout_logprob_error(tiny_qwen2):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=0.0))
    m = trainer.train_step(make_batch(trainer, GOOD + BAD, [1.0, 0.0, 1.0, 0.0], logprob_shift=0.25))
    assert m.logprob_mismatch_mean == pytest.approx(0.25, abs=1e-4)
    assert m.logprob_mismatch_max == pytest.approx(0.25, abs=1e-4)


def test_kl_to_reference_is_zero_at_start_and_grows(tiny_qwen2):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=1e-3, kl_coef=0.1, kl_estimator="k3"))
    responses, rewards = GOOD + BAD, [1.0, 1.0, 0.0, 0.0]
    m1 = trainer.train_step(make_batch(trainer, responses, rewards))
    assert m1.kl == pytest.approx(0.0, abs=1e-6)  # the policy is still the reference
    m2 = trainer.train_step(make_batch(trainer, responses, rewards))
    assert m2.kl > 1e-4


def test_rollout_old_logprobs_are_clipped_across_mini_batches(tiny_qwen2):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=1e-3, old_logprobs="rollout", mini_batches=2))
    responses, rewards = GOOD + BAD, [1.0, 1.0, 0.0, 0.0]
    m1 = trainer.train_step(make_batch(trainer, responses, rewards))
    assert m1.extra["mini_batches"] == 2 and m1.pg_clipfrac < 0.5
    # rollout logprobs off by +1 nat: ratio = e^-1 on every token, far outside [0.8, 1.2];
    # the clipped branch (ratio held at 0.8) is the pessimistic one wherever the advantage is negative:
    # the 6 of 12 tokens of the unrewarded responses
    m2 = trainer.train_step(make_batch(trainer, responses, rewards, logprob_shift=1.0))
    assert m2.pg_clipfrac == pytest.approx(0.5, abs=1e-6)
    assert m2.extra["ratio_mean"] < 0.5


def test_sft_step_lowers_nll(tiny_qwen2):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=3e-3))
    examples = [SFTExample(PROMPT, r) for r in GOOD]
    first = trainer.sft_step(examples).loss
    for _ in range(3):
        last = trainer.sft_step(examples).loss
    assert last < first - 0.5


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_accumulates_the_same_gradient(tiny_qwen2, agg):
    """One sequence per micro-batch must give the loss and gradient of the whole batch at once."""
    from seer.trainer.batching import TrainSequence

    seqs = [
        TrainSequence(PROMPT, r, advantage=a) for r, a in zip(GOOD + BAD, [1.0, 0.5, -1.0, -0.5], strict=True)
    ]
    results = []
    for budget in (1, 10_000):
        trainer = Trainer(tiny_qwen2, TrainerConfig(lr=0.0, loss_agg=agg, max_tokens_per_micro_batch=budget))
        results.append(trainer.train_sequences(seqs))
    split, whole = results
    assert split.loss == pytest.approx(whole.loss, abs=1e-6)
    assert split.grad_norm == pytest.approx(whole.grad_norm, rel=1e-5)
    assert split.entropy == pytest.approx(whole.entropy, rel=1e-5)
