"""GRPO on multi-turn samples: rollout log-probs cover the generated tokens only, and the
train-inference mismatch and the update see those tokens, never the environment's."""

from __future__ import annotations

import pytest

from seer.trainer import Trainer, TrainerConfig
from seer.trainer.batching import response_logprobs
from seer.types import IterationStats, PromptSpec, RolloutBatch, Sample

PROMPT = [1, 2, 3, 4]
# generated (mask 1) and environment (mask 0) tokens of two trajectories
RESPONSES = [([5, 6, 20, 21, 7], [1, 1, 0, 0, 1]), ([9, 10, 22, 11, 12], [1, 1, 0, 1, 1])]


def test_response_logprobs_spread_generated_logprobs_over_the_mask():
    assert response_logprobs([-1.0, -2.0, -3.0], [1, 1, 0, 0, 1], 5) == [-1.0, -2.0, 0.0, 0.0, -3.0]
    assert response_logprobs([-1.0, -2.0], None, 2) == [-1.0, -2.0]
    assert response_logprobs([-1.0], [1, 1], 2) is None  # do not line up: unknown, not misaligned
    assert response_logprobs([], [1, 0], 2) is None


def multi_turn_batch(trainer: Trainer, shift: float) -> RolloutBatch:
    """Two trajectories whose log-probs (generated tokens only, as vLLM gave them) are the trainer's own + `shift`."""
    prompt = PromptSpec(0, "", PROMPT, {})
    samples = []
    for i, (ids, mask) in enumerate(RESPONSES):
        lp = trainer.score([PROMPT], [ids])[0]
        gen = [x + shift for x, m in zip(lp, mask) if m]
        samples.append(Sample(0, i, f"0-{i}", prompt, ids, gen, "stop", 0.0, 0.0, ["i0"], reward=float(i),
                              loss_mask=mask, turns=2))
    stats = IterationStats(0, "test", 0.0, 0, 0.0, 0.0, len(samples), 0)
    return RolloutBatch(samples, stats)


def test_mismatch_is_measured_on_generated_tokens_only(tiny_qwen2):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=0.0))
    seqs = trainer.sequences_from_batch(multi_turn_batch(trainer, 0.25))
    assert [len(s.rollout_logprobs) for s in seqs] == [5, 5]
    m = trainer.train_sequences(seqs)
    assert m.logprob_mismatch_mean == pytest.approx(0.25, abs=1e-4)
    assert m.logprob_mismatch_max == pytest.approx(0.25, abs=1e-4)


def test_an_update_on_trajectories_trains_the_generated_tokens_only(tiny_qwen2):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=3e-3, old_logprobs="rollout"))
    m = trainer.train_step(multi_turn_batch(trainer, 0.0))
    assert m.logprob_mismatch_mean == pytest.approx(0.0, abs=1e-4)
    assert m.tokens == sum(sum(mask) for _, mask in RESPONSES)
