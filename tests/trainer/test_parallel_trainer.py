"""Data and tensor parallelism are exact: a GRPO step at DP=2 or TP=2 (two Ray actors, gloo)
computes DP=1's gradients, and a checkpoint of any of these world sizes resumes at the others,
Adam moments included.

The model is the tiny tied Qwen3 (QK-norm, decoupled head_dim): the family whose TP step needs
the most (QK-norm grads summed over the heads' ranks); Qwen2's biases under TP are checked in
test_tensor_parallel.py.

Tolerance: the two ranks sum their shards' gradients in another order than one rank does, so
gradients agree to float32 summation noise, not bit for bit: |dp2 - dp1| <= 1e-6 + 1e-4 |dp1|
(weights after an Adam step: 1e-4 + 1e-4 |w|, as Adam magnifies that noise).
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace

import pytest
import torch

from seer.trainer.batching import TrainSequence
from seer.trainer.config import TrainerConfig
from tests.trainer import rank_steps

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def _functions_by_value(ray_session):
    """The functions these tests run on the ranks travel by value (this module is not importable there)."""
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(rank_steps)


def _seqs(seed: int, n: int = 12) -> list[TrainSequence]:
    return rank_steps.sequences(seed, n, longest=30)


# The tests above the layout test pin the padded layout they were written for: after a few steps at
# lr 1e-2 the TP=2 summation noise sits near the bound, so their outcome depends on the exact
# earlier steps. The layout test below starts every layout from the fresh weights.
CFG = dict(lr=1e-2, max_tokens_per_micro_batch=64, threads_per_rank=1, kl_coef=0.05, mini_batches=2,
           batch_layout="padded")
FRESH: dict = {}  # "checkpoint": the fresh weights, saved as the groups start


@pytest.fixture(scope="module")
def groups(ray_session, tiny_qwen3_tied, tmp_path_factory):
    from seer.trainer.group import TrainerGroup

    one = TrainerGroup.start(tiny_qwen3_tied, TrainerConfig(**CFG))
    two = TrainerGroup.start(tiny_qwen3_tied, TrainerConfig(**CFG, data_parallel=2))
    tp2 = TrainerGroup.start(tiny_qwen3_tied, TrainerConfig(**CFG, tensor_parallel=2))
    FRESH["checkpoint"] = one.save_checkpoint(tmp_path_factory.mktemp("fresh")).parent
    yield one, two, tp2
    for g in (one, two, tp2):
        g.close()


def test_dp2_gradients_and_metrics_equal_dp1(groups):
    one, two, _ = groups
    assert [r.rank for r in two.infos] == [0, 1]
    seqs = _seqs(0)
    (m1, g1), = one.apply(lambda t: rank_steps.capture(t, seqs))
    results = two.apply(lambda t: rank_steps.capture(t, seqs))
    (m2, g2), (m2b, g2b) = results
    assert len(g1) == len(g2) == 2  # two mini-batches, each one optimizer step
    rank_steps.assert_close(g2[0], g1[0], "mini-batch 0 gradient")
    # mini-batch 1 is taken after an Adam step, whose weights already carry the magnified noise
    rank_steps.assert_close(g2[1], g1[1], "mini-batch 1 gradient", atol=1e-4)
    for step in range(2):
        for name in g2[step]:  # every rank applies the same all-reduced gradient
            assert torch.equal(g2[step][name], g2b[step][name])
    assert replace(m2, time_s=0) == replace(m2b, time_s=0)  # every rank reports the global numbers
    for field in ("loss", "pg_loss", "pg_clipfrac", "kl", "entropy", "grad_norm", "logprob_mismatch_mean",
                  "logprob_mismatch_max"):
        assert getattr(m2, field) == pytest.approx(getattr(m1, field), rel=1e-4, abs=1e-6), field
    assert (m2.tokens, m2.sequences, m2.iteration) == (m1.tokens, m1.sequences, m1.iteration)
    # the shards really split the work: each rank trained on part of the batch, balanced by tokens
    shares = two.apply(lambda t: [len(mb.indices) for mb in t._micro_batches(t._my_share(seqs, [s.length for s in seqs]))])
    assert all(sum(s) < len(seqs) for s in shares)


def test_a_rank_with_an_empty_shard_still_reduces(groups):
    """Fewer sequences than ranks: one rank trains on nothing and contributes zero gradients."""
    one, two, _ = groups
    seqs = _seqs(1, n=1)
    (m1, g1), = one.apply(lambda t: rank_steps.capture(t, seqs))
    (m2, g2), _ = two.apply(lambda t: rank_steps.capture(t, seqs))
    rank_steps.assert_close(g2[0], g1[0], "gradient")
    assert m2.loss == pytest.approx(m1.loss, rel=1e-4, abs=1e-6)


def test_tp2_gradients_and_metrics_equal_dp1(groups, tmp_path):
    """Each TP rank holds half of every split layer; the gathered gradients are DP=1's, and the
    clipped global grad norm counts the replicated norms once."""
    one, _, tp2 = groups
    one.save_checkpoint(tmp_path / "same-start")  # the groups' earlier tests trained DP=1 only
    tp2.load_checkpoint(tmp_path / "same-start")
    seqs = _seqs(4)
    (m1, g1), = one.apply(lambda t: rank_steps.capture(t, seqs))
    (m2, g2), (m2b, g2b) = tp2.apply(lambda t: rank_steps.capture(t, seqs))
    shapes = tp2.apply(lambda t: dict(t.model.named_parameters())["decoder.layers.0.mlp.linear_fc1.weight"].shape)
    assert shapes[0][0] * 2 == g1[0]["decoder.layers.0.mlp.linear_fc1.weight"].shape[0]  # really split
    rank_steps.assert_close(g2[0], g1[0], "mini-batch 0 gradient")
    rank_steps.assert_close(g2[1], g1[1], "mini-batch 1 gradient", atol=1e-4)
    assert replace(m2, time_s=0) == replace(m2b, time_s=0)
    for field in ("loss", "pg_loss", "pg_clipfrac", "kl", "entropy", "grad_norm", "logprob_mismatch_mean"):
        assert getattr(m2, field) == pytest.approx(getattr(m1, field), rel=1e-4, abs=1e-6), field
    # the exported HF weights are whole (gathered), as at one rank
    hf1, hf2 = one.apply(lambda t: t.hf_state_dict())[0], tp2.apply(lambda t: t.hf_state_dict())[0]
    assert {k: v.shape for k, v in hf1.items()} == {k: v.shape for k, v in hf2.items()}


def test_checkpoint_moves_between_world_sizes(groups, tmp_path):
    """DP=2 -> DP=1, DP=1 -> TP=2 and TP=2 -> DP=2: the resumed trainer takes the same next step as
    the one that saved (weights and Adam moments restored, resharded)."""
    one, two, tp2 = groups
    for src, dst, tag in ((two, one, "dp2-to-dp1"), (one, tp2, "dp1-to-tp2"), (tp2, two, "tp2-to-dp2")):
        src.apply(lambda t: t.train_sequences(_seqs(2)))
        src.save_checkpoint(tmp_path / tag)
        assert dst.load_checkpoint(tmp_path / tag) == src.apply(lambda t: t.iteration)[0]
        before = src.apply(rank_steps.full_params)[0]
        assert all(torch.equal(before[n], p) for n, p in dst.apply(rank_steps.full_params)[0].items())
        nxt = _seqs(3)
        src.apply(lambda t: t.train_sequences(nxt))
        dst.apply(lambda t: t.train_sequences(nxt))
        # Adam divides by sqrt(v): gradient noise of 1e-7 moves a weight by up to ~1e-5; a step
        # without the restored moments moves it by ~lr = 1e-2, far outside this bound.
        rank_steps.assert_close(dst.apply(rank_steps.full_params)[0], src.apply(rank_steps.full_params)[0], f"{tag} weights after the next step", atol=1e-4)


def _group_seqs(seed: int) -> list[TrainSequence]:
    """GRPO groups sharing prompts (and first response tokens), so the tree really merges."""
    rng = random.Random(seed)
    out = []
    for _ in range(3):
        prompt = [rng.randrange(1, 64) for _ in range(rng.randint(4, 10))]
        for i in range(4):
            resp = ([9] if i % 2 else []) + [rng.randrange(1, 64) for _ in range(rng.choice([2, 5, 8, 30]))]
            out.append(TrainSequence(prompt, resp, advantage=rng.uniform(-1, 1),
                                     rollout_logprobs=[-rng.uniform(1, 5) for _ in resp]))
    return out


def _capture_as(layout: str, seqs):
    def run(t):
        t.config.batch_layout = layout
        return rank_steps.capture(t, seqs)
    return run


def test_tree_and_packed_at_dp2_and_tp2_equal_padded_dp1(groups):
    """Prefix-tree and packed micro-batches at DP=2 and TP=2 (KL on, two mini-batches) give the
    padded DP=1 step's gradients and metrics; every layout starts from the fresh weights."""
    one, two, tp2 = groups
    start = FRESH["checkpoint"]
    one.load_checkpoint(start)
    seqs = _group_seqs(5)
    (m0, g0), = one.apply(_capture_as("padded", seqs))
    for group, layout in ((two, "tree"), (tp2, "tree"), (two, "packed")):
        group.load_checkpoint(start)
        (m, g), (mb, _) = group.apply(_capture_as(layout, seqs))
        rank_steps.assert_close(g[0], g0[0], f"{layout} mini-batch 0 gradient")
        rank_steps.assert_close(g[1], g0[1], f"{layout} mini-batch 1 gradient", atol=1e-4)
        assert replace(m, time_s=0) == replace(mb, time_s=0)
        for field in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "logprob_mismatch_mean"):
            assert getattr(m, field) == pytest.approx(getattr(m0, field), rel=1e-4, abs=1e-6), (layout, field)
        assert m.extra["computed_tokens"] < m0.extra["computed_tokens"]
    one.load_checkpoint(start)
    (mt, _), = one.apply(_capture_as("tree", seqs))
    assert m.extra["tree_token_ratio"] == 1.0 and mt.extra["tree_token_ratio"] < 0.9  # packed: no repeats, tree: fewer
    for g in groups:  # back to this module's layout for whatever runs next
        g.apply(lambda t: setattr(t.config, "batch_layout", CFG["batch_layout"]))
