"""What the parallel-trainer tests run on Ray ranks and compare: random GRPO sequences, a step that
keeps its gradients, whole parameters, and the tolerance check. Shared by the DP/TP and the EP
tests; each registers this module to travel by value (the ranks cannot import tests/)."""

from __future__ import annotations

import random

from seer.trainer.batching import TrainSequence

ATOL, RTOL = 1e-6, 1e-4  # |a - b| <= ATOL + RTOL |b|: float32 summation order across ranks


def sequences(seed: int, n: int, longest: int) -> list[TrainSequence]:
    """Heavy-tailed response lengths (up to `longest`), as rollouts have, so ranks' shards differ in
    micro-batches and shapes; advantages of both signs; rollout log-probs."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(1, 64) for _ in range(rng.randint(2, 6))]
        resp = [rng.randrange(1, 64) for _ in range(rng.choice([2, 3, 5, 8, longest]))]
        out.append(TrainSequence(prompt, resp, advantage=rng.uniform(-1, 1),
                                 rollout_logprobs=[-rng.uniform(1, 5) for _ in resp]))
    return out


def capture(trainer, seqs):
    """One train step on a rank: its metrics and each mini-batch's gradients."""
    trainer.captured_grads = []
    metrics = trainer.train_sequences(seqs)
    grads, trainer.captured_grads = trainer.captured_grads, None
    return metrics, grads


def full_params(trainer):
    """Whole tensors (gathered across tensor- and expert-parallel ranks: every rank must call this)."""
    return trainer._full_state({n: p.detach().clone() for n, p in trainer.model.named_parameters()})


def assert_close(a: dict, b: dict, what: str, atol: float = ATOL) -> None:
    assert a.keys() == b.keys()
    for name in a:
        diff = (a[name] - b[name]).abs()
        assert bool((diff <= atol + RTOL * b[name].abs()).all()), f"{what} {name}: max diff {float(diff.max()):.3g}"
