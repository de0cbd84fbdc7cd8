"""The group suffix tree and drafting, against brute force."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from seer.dgds.drafting import draft
from seer.dgds.suffix_tree import SuffixTree
from seer.dgds.types import DraftParams

from .brute import continuations, occurrences, substring_counts

small_seqs = st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4)


def build(seqs, depth, chunks=None):
    """Feed the sequences in interleaved chunks (the order a server sees)."""
    tree = SuffixTree(depth)
    ids = [tree.add_sequence() for _ in seqs]
    pos = [0] * len(seqs)
    rng = random.Random(chunks)
    while any(p < len(s) for p, s in zip(pos, seqs)):
        i = rng.choice([i for i, s in enumerate(seqs) if pos[i] < len(s)])
        k = rng.randint(1, 5)
        tree.extend(ids[i], seqs[i][pos[i] : pos[i] + k])
        pos[i] += k
    return tree


@settings(max_examples=150, deadline=None)
@given(small_seqs, st.integers(2, 8), st.integers(0, 1000))
def test_counts_are_exact(seqs, depth, seed):
    tree = build(seqs, depth, seed)
    expected = substring_counts(seqs, depth)
    for w, n in expected.items():
        assert tree.count(w) == n
    assert tree.num_tokens == sum(map(len, seqs)) == tree.count(())
    # Absent patterns count zero; patterns longer than the depth bound are not indexed.
    assert tree.count((9,)) == 0
    for w in list(expected)[:20]:
        assert tree.count(w + (9,)) == 0


@settings(max_examples=100, deadline=None)
@given(small_seqs, st.integers(2, 8), st.integers(0, 1000), st.integers(0, 1000))
def test_layout_is_canonical_whatever_the_interleaving(seqs, depth, seed_a, seed_b):
    a = build(seqs, depth, seed_a)
    b = build(list(reversed(seqs)), depth, seed_b)
    assert a.snapshot() == b.snapshot()
    assert a.num_nodes == len(a.snapshot())
    # Path compression: every non-root node either branches or is where a window ends.
    for path, node in a.iter_nodes():
        if path:
            kids = node.children or {}
            assert len(kids) != 1 or sum(c.count for c in kids.values()) < node.count


def _check_path(seqs, context, match_len, path, depth):
    pattern = tuple(context[len(context) - match_len :])
    base = occurrences(seqs, pattern)
    assert base > 0
    full = pattern + path.tokens
    assert len(full) <= depth
    # The drafted sequence occurs right after an occurrence of the matched pattern...
    assert occurrences(seqs, full) > 0
    # ...and each cumulative probability is the product of child/parent counts, which telescopes.
    for i, p in enumerate(path.probs):
        assert abs(p - occurrences(seqs, pattern + path.tokens[: i + 1]) / base) < 1e-9


@settings(max_examples=150, deadline=None)
@given(
    small_seqs,
    st.lists(st.integers(0, 3), min_size=1, max_size=12),
    st.integers(3, 10),
    st.integers(1, 3),
    st.integers(1, 6),
    st.integers(1, 8),
    st.sampled_from([0.0, 0.1, 0.3]),
)
def test_linear_draft_follows_the_most_frequent_continuation(seqs, context, depth, lmin, lmax_extra, budget, floor):
    tree = build(seqs, depth, 0)
    params = DraftParams(budget, lmin, lmin + lmax_extra, 1, floor)
    paths, match_len = draft(tree, context, params)
    hi = min(params.pattern_lookup_max, len(context), depth - 1)
    # match_len is the longest suffix in range that occurs with a continuation
    def continues(n):
        return sum(continuations(seqs, context[len(context) - n :]).values()) > 0
    longest = max((n for n in range(lmin, hi + 1) if continues(n)), default=0)
    assert match_len == longest
    if not match_len:
        assert paths == []
        return
    if not paths:  # even the most frequent continuation is below the floor
        ctx = tuple(context[len(context) - match_len :])
        assert max(continuations(seqs, ctx).values()) / occurrences(seqs, ctx) < floor
        return
    assert len(paths) == 1
    path = paths[0]
    assert 1 <= len(path.tokens) <= min(budget, depth - match_len)
    _check_path(seqs, context, match_len, path, depth)
    assert all(p >= floor for p in path.probs)
    # Greedy: each token is a most frequent continuation (smallest id on ties).
    ctx = tuple(context[len(context) - match_len :])
    for tok in path.tokens:
        nxt = continuations(seqs, ctx)
        top = max(nxt.values())
        assert tok == min(t for t, n in nxt.items() if n == top)
        ctx += (tok,)
    # It stopped for a reason: budget, depth, no continuation, or the floor.
    if len(path.tokens) < min(budget, depth - match_len):
        nxt = continuations(seqs, ctx)
        assert not nxt or path.probs[-1] * max(nxt.values()) / occurrences(seqs, ctx) < floor


@settings(max_examples=100, deadline=None)
@given(small_seqs, st.lists(st.integers(0, 3), min_size=1, max_size=10), st.integers(2, 4), st.integers(1, 6))
def test_multi_path_returns_distinct_valid_branches_best_first(seqs, context, k, budget):
    depth = 8
    tree = build(seqs, depth, 1)
    paths, match_len = draft(tree, context, DraftParams(budget, 1, 6, k, 0.0))
    assert len(paths) <= k
    assert len({p.tokens for p in paths}) == len(paths)
    scores = [p.score for p in paths]
    assert scores == sorted(scores, reverse=True)
    for p in paths:
        _check_path(seqs, context, match_len, p, depth)
    linear, _ = draft(tree, context, DraftParams(budget, 1, 6, 1, 0.0))
    assert bool(linear) == bool(paths)


def test_group_references_make_drafts_own_history_alone_cannot():
    """A request that starts what a sibling already wrote gets the sibling's continuation."""
    tree = SuffixTree(16)
    sibling, me = tree.add_sequence(), tree.add_sequence()
    tree.extend(sibling, [5, 6, 7, 8, 9, 10, 11])
    tree.extend(me, [1, 5, 6, 7])
    paths, match_len = draft(tree, [1, 5, 6, 7], DraftParams(4, 1, 8, 1, 0.0))
    assert match_len == 3
    assert paths[0].tokens == (8, 9, 10, 11)
    # own occurrence of (5, 6, 7) has no continuation yet, so probability is 1/2
    assert paths[0].probs[0] == 0.5


def test_depth_bound_caps_match_plus_draft():
    tree = SuffixTree(4)
    s = tree.add_sequence()
    tree.extend(s, list(range(10)) * 2)
    paths, match_len = draft(tree, [0, 1, 2], DraftParams(8, 1, 8, 1, 0.0))
    assert match_len == 3
    assert paths[0].tokens == (3,)  # depth 4 = 3 matched + 1 drafted
