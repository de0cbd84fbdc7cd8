"""Packed and prefix-tree micro-batches compute what the padded layout computes, with fewer tokens.

The tree merges a group's shared prompt and a multi-turn sample's earlier turns; each shared token
is computed once, and every per-token result (log-probs, entropy, the KL reference's log-probs) and
every gradient equals the padded path's within the parallel-trainer tests' tolerance
(|d| <= 1e-6 + 1e-4 |g|), in both aggregation modes with KL and entropy on.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from seer.trainer.batching import TrainSequence, make_micro_batches
from seer.trainer.config import TrainerConfig
from seer.trainer.packing import (CostModel, build_stream, make_stream_micro_batches, plan_stream_micro_batches,
                                  shard_streams, split_mini_batches)
from seer.types import Routing

ATOL, RTOL = 1e-6, 1e-4


def group_seqs(seed: int, groups: int = 3, g: int = 4) -> list[TrainSequence]:
    """GRPO groups (G samples sharing a prompt, some with equal first response tokens), plus a
    multi-turn sample whose earlier turn is a whole other sample and a sample equal to another."""
    rng = random.Random(seed)
    seqs = []
    for _ in range(groups):
        prompt = [rng.randrange(1, 64) for _ in range(rng.randint(3, 9))]
        for i in range(g):
            resp = ([7, 7] if i % 2 else []) + [rng.randrange(1, 64) for _ in range(rng.choice([1, 2, 5, 9, 20]))]
            seqs.append(TrainSequence(prompt, resp, advantage=rng.uniform(-1, 1),
                                      rollout_logprobs=[-rng.uniform(1, 4) for _ in resp]))
    first = seqs[0]
    seqs.append(TrainSequence(first.prompt_ids + first.response_ids + [5, 6], [7, 8, 9], advantage=0.3,
                              loss_mask=[1, 0, 1]))
    seqs.append(seqs[1])
    return seqs


def test_tree_stream_holds_each_shared_token_once_and_positions_restart():
    a = TrainSequence([1, 2, 3], [4, 5])
    b = TrainSequence([1, 2, 3], [4, 6, 7])
    c = TrainSequence([1, 2, 3], [8])
    d = TrainSequence([9], [1])
    ids, layout, paths = build_stream([a, b, c, d], share=True)
    assert ids.numel() == 3 + 1 + 1 + 2 + 1 + 2  # the trie: 1 2 3 | 4 | 5 , 6 7 | 8 ; 9 1
    for s, path in zip((a, b, c, d), paths):
        assert ids[path].tolist() == s.prompt_ids + s.response_ids
        assert layout.positions[path].tolist() == list(range(s.length))  # RoPE position in its own sequence
    assert paths[0][:4] == paths[1][:4] == paths[2][:3] + [paths[0][3]]  # one copy of 1 2 3 4
    starts = [blk.start for blk in layout.blocks]
    assert starts == sorted(starts) and layout.blocks[-1].end == ids.numel()
    leaf = next(blk for blk in layout.blocks if ids[blk.start] == 6)
    assert ids[leaf.context].tolist() == [1, 2, 3, 4]  # a branch attends to its own path only
    ids_p, layout_p, _ = build_stream([a, b, c, d], share=False)
    assert ids_p.numel() == sum(s.length for s in (a, b, c, d))
    assert all(blk.context is None for blk in layout_p.blocks)


def test_tokens_with_different_routing_are_not_shared():
    def routed(tokens, row_of):
        return Routing(layers=1, top_k=2, dtype="uint8", data=b"".join(row_of(i) for i in range(len(tokens))))

    same = lambda i: bytes([0, 1])  # noqa: E731
    a = TrainSequence([1, 2, 3], [4], routing=routed([1, 2, 3, 4], same))
    b = TrainSequence([1, 2, 3], [5], routing=routed([1, 2, 3, 5], lambda i: bytes([0, 1]) if i < 2 else bytes([2, 3])))
    ids, _, paths = build_stream([a, b], share=True)
    assert paths[0][:2] == paths[1][:2] and paths[0][2] != paths[1][2]  # shared up to where routing differs
    assert ids.numel() == 2 + 2 + 2


def test_micro_batch_budget_counts_real_tokens():
    seqs = group_seqs(0)
    for share in (False, True):
        plans = plan_stream_micro_batches(seqs, 40, share)
        assert sorted(i for p in plans for i in p) == list(range(len(seqs)))
        for mb in make_stream_micro_batches(seqs, 40, share):
            real = mb.stream.computed_tokens
            assert real <= 40 or len(mb.indices) == 1
            if not share:
                assert real == sum(seqs[i].length for i in mb.indices)  # no padding
    # 50 tree tokens a group: a greedy fill would take group 2's first sample into the first
    # micro-batch (70 tokens) and compute group 2's prompt twice; the cut goes between the groups
    two_groups = [TrainSequence([g] * 10, [10 + i] * 10) for g in (1, 2) for i in range(4)]
    assert sorted(map(sorted, plan_stream_micro_batches(two_groups, 70, True))) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    tree = sum(mb.stream.computed_tokens for mb in make_stream_micro_batches(seqs, 10_000, True))
    padded = sum(mb.input_ids.numel() for mb in make_micro_batches(seqs, 10_000))
    assert tree < sum(s.length for s in seqs) < padded


def test_dp_shards_balance_compute_and_keep_groups_together():
    seqs = group_seqs(1, groups=4, g=4)[:16]
    cost = CostModel(per_token=1.0, per_pair=0.01)
    shards = shard_streams(seqs, 2, True, cost)
    assert sorted(shards[0] + shards[1]) == list(range(16)) and all(shards)
    prompts = [{tuple(seqs[i].prompt_ids) for i in s} for s in shards]
    assert len(prompts[0] & prompts[1]) <= 1  # at most the group a cut falls in is split
    packed = shard_streams(seqs, 2, False, cost)
    loads = [sum(cost.cost(seqs[i].length, 0) for i in s) for s in packed]
    assert max(loads) - min(loads) <= max(cost.cost(s.length, 0) for s in seqs)


def test_mini_batches_keep_groups_whole_and_balance_tokens():
    seqs = group_seqs(4, groups=6, g=4)[:24]
    random.Random(0).shuffle(seqs)  # groups need not arrive together
    parts = split_mini_batches(seqs, 3)
    assert sorted(i for p in parts for i in p) == list(range(24)) and all(parts)
    prompts = [{tuple(seqs[i].prompt_ids) for i in p} for p in parts]
    assert all(not (a & b) for j, a in enumerate(prompts) for b in prompts[j + 1:])  # no group in two
    tokens = [sum(seqs[i].length for i in p) for p in parts]
    even = sum(tokens) / 3  # each cut lands within a quarter of a mini-batch of the even split
    assert all(even / 2 <= t <= even * 3 / 2 for t in tokens), tokens
    with pytest.raises(ValueError, match="mini_batch_split"):
        TrainerConfig(mini_batch_split="random")


@pytest.fixture(scope="module")
def trainer(tiny_qwen2):
    from seer.trainer.trainer import Trainer

    return Trainer(tiny_qwen2, TrainerConfig(lr=1e-2, kl_coef=0.05, entropy_coef=0.01, max_tokens_per_micro_batch=48))


def _step(trainer, seqs, layout: str, agg: str):
    """One update on a fresh copy of the same weights and optimizer state."""
    state = copy.deepcopy(trainer.state_dict())  # at one rank it aliases the live parameters
    trainer.config.batch_layout, trainer.config.loss_agg = layout, agg
    trainer.captured_grads = []
    try:
        metrics = trainer.train_sequences(seqs)
        return metrics, trainer.captured_grads[0]
    finally:
        trainer.captured_grads = None
        trainer.load_state_dict(state)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_tree_and_packed_gradients_equal_padded(trainer, agg):
    seqs = group_seqs(2)
    m0, g0 = _step(trainer, seqs, "padded", agg)
    for layout in ("packed", "tree"):
        m, g = _step(trainer, seqs, layout, agg)
        for name in g0:
            diff = (g[name] - g0[name]).abs()
            assert bool((diff <= ATOL + RTOL * g0[name].abs()).all()), f"{layout} {name}: {float(diff.max()):.3g}"
        for field in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "logprob_mismatch_mean"):
            assert getattr(m, field) == pytest.approx(getattr(m0, field), rel=1e-5, abs=1e-6), (layout, field)
        assert m.tokens == m0.tokens
    assert m.extra["tree_token_ratio"] < 0.85 < m0.extra["tree_token_ratio"]  # the tree computed fewer tokens
    assert m.record()["tree_token_ratio"] == m.extra["tree_token_ratio"]


def test_group_mini_batches_compute_each_prompt_once_with_padded_gradients(trainer):
    seqs = group_seqs(5, groups=4, g=4)[:16]
    state = copy.deepcopy(trainer.state_dict())
    trainer.config.mini_batches, trainer.config.loss_agg = 2, "token-mean"
    runs = {}
    try:
        for split, layout in (("groups", "padded"), ("groups", "tree"), ("strided", "tree")):
            trainer.config.mini_batch_split, trainer.config.batch_layout = split, layout
            trainer.captured_grads = []
            runs[split, layout] = trainer.train_sequences(seqs), trainer.captured_grads
            trainer.load_state_dict(copy.deepcopy(state))
    finally:
        trainer.captured_grads, trainer.config.mini_batches, trainer.config.mini_batch_split = None, 1, "groups"
    (_, ref), (tree, grads) = runs["groups", "padded"], runs["groups", "tree"]
    # mini-batch 1 follows an Adam step, which magnifies float noise (as in test_parallel_trainer)
    for k, (step, ref_step, atol) in enumerate(zip(grads, ref, (ATOL, 1e-4), strict=True)):
        for name in ref_step:
            diff = (step[name] - ref_step[name]).abs()
            assert bool((diff <= atol + RTOL * ref_step[name].abs()).all()), f"{k} {name}: {float(diff.max()):.3g}"
    prompts = sum(len(s.prompt_ids) for s in seqs[::4])  # each of the 4 groups' prompt once
    strided = runs["strided", "tree"][0].extra["computed_tokens"]
    assert tree.extra["computed_tokens"] <= strided - prompts  # strided computes every prompt in both


def test_per_token_logprobs_entropy_and_reference_equal_padded(trainer):
    """... and so do streams grown by a pad block (expert parallelism's equalisation): no real
    token attends to the pad tokens, and no row reads them."""
    from seer.trainer.moe import pad_micro_batch

    seqs = group_seqs(3)
    out = {}
    for layout in ("padded", "packed", "tree", "packed+pad", "tree+pad"):
        trainer.config.batch_layout = layout.removesuffix("+pad")
        mbs = trainer._micro_batches(seqs)
        if layout.endswith("+pad"):
            mbs = [pad_micro_batch(mb, 1, mb.stream.computed_tokens + 1 + k, trainer.config.pad_token_id)
                   for k, mb in enumerate(mbs)]
            assert all(mb.stream.layout.blocks[-1].context is None for mb in mbs)
        rows = {}
        with torch.no_grad():
            for mb in mbs:
                lp, ent = trainer._token_stats(trainer.model, mb, "detached")
                ref = trainer._token_logprobs(trainer.ref_model, mb)
                for r, i in enumerate(mb.indices):
                    n = seqs[i].length - 1
                    rows[i] = torch.stack([lp[r, :n], ent[r, :n], ref[r, :n]])
        out[layout] = rows
    for layout in ("packed", "tree"):
        for i in range(len(seqs)):
            torch.testing.assert_close(out[layout][i], out["padded"][i], atol=2e-6, rtol=1e-5)
            torch.testing.assert_close(out[layout + "+pad"][i], out[layout][i], atol=1e-6, rtol=1e-6)
    def scored():
        return [x for row in trainer.score([s.prompt_ids for s in seqs], [s.response_ids for s in seqs]) for x in row]

    tree = scored()
    trainer.config.batch_layout = "padded"
    assert tree == pytest.approx(scored(), abs=2e-6)
    trainer.config.batch_layout = "tree"
