"""The group suffix tree and drafting, against brute force."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from seer.dgds.tree.drafting import draft
from seer.dgds.tree.suffix_tree import SuffixTree
from seer.dgds.types import DraftParams

from .brute import continuations, occurrences, substring_counts

small_seqs = st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4)


# Both appends: the compiled core (the default; required) and the pure-Python reference.
IMPLS = [pytest.param(False, id="python"), pytest.param(True, id="compiled")]


def build(seqs, depth, chunks=None, compiled=None):
    """Feed the sequences in interleaved chunks (the order a server sees)."""
    tree = SuffixTree(depth, compiled=compiled)
    ids = [tree.add_sequence() for _ in seqs]
    pos = [0] * len(seqs)
    rng = random.Random(chunks)
    while any(p < len(s) for p, s in zip(pos, seqs)):
        i = rng.choice([i for i, s in enumerate(seqs) if pos[i] < len(s)])
        k = rng.randint(1, 5)
        tree.extend(ids[i], seqs[i][pos[i] : pos[i] + k])
        pos[i] += k
    return tree


@pytest.mark.parametrize("compiled", IMPLS)
@settings(max_examples=150, deadline=None)
@given(small_seqs, st.integers(2, 8), st.integers(0, 1000))
def test_counts_are_exact(compiled, seqs, depth, seed):
    tree = build(seqs, depth, seed, compiled)
    expected = substring_counts(seqs, depth)
    for w, n in expected.items():
        assert tree.count(w) == n
    assert tree.num_tokens == sum(map(len, seqs)) == tree.count(())
    # Absent patterns count zero; patterns longer than the depth bound are not indexed.
    assert tree.count((9,)) == 0
    for w in list(expected)[:20]:
        assert tree.count(w + (9,)) == 0


@pytest.mark.parametrize("compiled", IMPLS)
@settings(max_examples=100, deadline=None)
@given(small_seqs, st.integers(2, 8), st.integers(0, 1000), st.integers(0, 1000))
def test_layout_is_canonical_whatever_the_interleaving(compiled, seqs, depth, seed_a, seed_b):
    a = build(seqs, depth, seed_a, compiled)
    b = build(list(reversed(seqs)), depth, seed_b, compiled)
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


@pytest.mark.parametrize("compiled", IMPLS)
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
def test_linear_draft_follows_the_most_frequent_continuation(compiled, seqs, context, depth, lmin, lmax_extra,
                                                             budget, floor):
    tree = build(seqs, depth, 0, compiled)
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


@pytest.mark.parametrize("compiled", IMPLS)
@settings(max_examples=100, deadline=None)
@given(small_seqs, st.lists(st.integers(0, 3), min_size=1, max_size=10), st.integers(2, 4), st.integers(1, 6))
def test_multi_path_returns_distinct_valid_branches_best_first(compiled, seqs, context, k, budget):
    depth = 8
    tree = build(seqs, depth, 1, compiled)
    paths, match_len = draft(tree, context, DraftParams(budget, 1, 6, k, 0.0))
    assert len(paths) <= k
    assert len({p.tokens for p in paths}) == len(paths)
    scores = [p.score for p in paths]
    assert scores == sorted(scores, reverse=True)
    for p in paths:
        _check_path(seqs, context, match_len, p, depth)
    linear, _ = draft(tree, context, DraftParams(budget, 1, 6, 1, 0.0))
    assert bool(linear) == bool(paths)


@pytest.mark.parametrize("compiled", IMPLS)
def test_group_references_make_drafts_own_history_alone_cannot(compiled):
    """A request that starts what a sibling already wrote gets the sibling's continuation."""
    tree = SuffixTree(16, compiled=compiled)
    sibling, me = tree.add_sequence(), tree.add_sequence()
    tree.extend(sibling, [5, 6, 7, 8, 9, 10, 11])
    tree.extend(me, [1, 5, 6, 7])
    paths, match_len = draft(tree, [1, 5, 6, 7], DraftParams(4, 1, 8, 1, 0.0))
    assert match_len == 3
    assert paths[0].tokens == (8, 9, 10, 11)
    # own occurrence of (5, 6, 7) has no continuation yet, so probability is 1/2
    assert paths[0].probs[0] == 0.5


@pytest.mark.parametrize("compiled", IMPLS)
def test_depth_bound_caps_match_plus_draft(compiled):
    tree = SuffixTree(4, compiled=compiled)
    s = tree.add_sequence()
    tree.extend(s, list(range(10)) * 2)
    paths, match_len = draft(tree, [0, 1, 2], DraftParams(8, 1, 8, 1, 0.0))
    assert match_len == 3
    assert paths[0].tokens == (3,)  # depth 4 = 3 matched + 1 drafted


def _node_fields(tree):
    return sorted((path, n.count, n.length, n.children is None) for path, n in tree.iter_nodes())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), max_size=120), min_size=1, max_size=4),
       st.sampled_from([2, 3, 5, 16, 64]), st.integers(0, 10**6))
def test_compiled_and_python_appends_build_the_same_tree_after_every_call(seqs, depth, seed):
    """Long, repetitive streams (open leaves, boundary moves, absorbs, windows that stop at the
    depth bound); every node's count, length and path agree after each call, whatever the input
    type (numpy arrays come from vLLM)."""
    import numpy as np

    rng = random.Random(seed)
    py, c = SuffixTree(depth, compiled=False), SuffixTree(depth, compiled=True)
    ids = [(py.add_sequence(), c.add_sequence()) for _ in seqs]
    pos = [0] * len(seqs)
    while any(p < len(s) for p, s in zip(pos, seqs)):
        i = rng.choice([i for i, s in enumerate(seqs) if pos[i] < len(s)])
        chunk = seqs[i][pos[i] : pos[i] + rng.randint(1, 12)]
        pos[i] += len(chunk)
        py.extend(ids[i][0], chunk)
        c.extend(ids[i][1], np.array(chunk, dtype=np.int64) if rng.random() < 0.3 else iter(chunk))
        assert _node_fields(c) == _node_fields(py)
        assert c.num_nodes == py.num_nodes
    assert c.seqs == py.seqs
    expected = substring_counts(seqs, depth)
    assert all(c.count(w) == n for w, n in expected.items())


def test_compiled_append_rejects_bad_tokens_and_keeps_the_tree_consistent():
    tree = SuffixTree(8, compiled=True)
    s = tree.add_sequence()
    tree.extend(s, [1, 2, 3])
    with pytest.raises(TypeError):
        tree.extend(s, [4, "x", 5])
    tree.extend(s, [6])
    assert tree.seqs[s] == [1, 2, 3, 4, 6]
    assert tree.snapshot() == build([[1, 2, 3, 4, 6]], 8, compiled=False).snapshot()
    with pytest.raises(IndexError):
        tree.extend(7, [1])


def test_compiled_trees_are_freed_without_the_cyclic_gc():
    """A compiled tree is plain C memory (no Python object per node, nothing for the cyclic GC to
    walk as trees grow): dropping a tree frees it at once."""
    import gc
    import tracemalloc

    rng = random.Random(0)
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tree = SuffixTree(64, compiled=True)
        ids = [tree.add_sequence() for _ in range(4)]
        for _ in range(1000):
            tree.extend(rng.choice(ids), [rng.randrange(20) for _ in range(8)])
        assert tree.num_nodes > 8000
        assert not gc.is_tracked(tree._c)
        built = tracemalloc.get_traced_memory()[0] - base
        del tree
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        gc.enable()
    assert built > 500_000 and left < built / 20, (built, left)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=80), min_size=1, max_size=5),
       st.sampled_from([2, 3, 5, 8, 16, 64]), st.integers(0, 10**6),
       st.lists(st.lists(st.integers(0, 5), max_size=20), min_size=1, max_size=6),
       st.integers(0, 10), st.integers(1, 4), st.integers(0, 6), st.integers(1, 5),
       st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.5]))
def test_compiled_drafts_are_the_python_drafts(seqs, depth, seed, contexts, budget, lmin, lmax_extra, k, floor):
    """The C drafting (match, greedy walk, top-k beam and its ranking) returns exactly the tokens,
    probabilities and match length of drafting.py's, on trees that reached the same state."""
    from seer.dgds.tree import drafting

    py, c = build(seqs, depth, seed, compiled=False), build(seqs, depth, seed, compiled=True)
    for ctx in contexts + [s[: len(s) // 2] for s in seqs]:
        for top_k in (1, k):
            params = DraftParams(budget, lmin, lmin + lmax_extra, top_k, floor)
            want = draft(py, ctx, params)
            assert draft(c, ctx, params) == want
            assert draft(c, tuple(ctx), params) == want
            if top_k > 1:  # the unranked form Python >= 3.12 ranks itself
                paths, match_len = c._c.draft(ctx, params, False)
                assert (drafting._rank(paths, top_k), match_len) == want


def test_compiled_core_handles_big_fanout_and_token_types():
    """Nodes with many children (hashed in the core), tokens beyond 32 bits, numpy ints; the
    Python view of a compiled tree has the Python tree's nodes."""
    import numpy as np

    rng = random.Random(1)
    seqs = [[rng.randrange(300) for _ in range(400)] + [2**40, 2**40 + 1, 7] for _ in range(3)]
    py, c = build(seqs, 16, 3, compiled=False), build(seqs, 16, 3, compiled=True)
    assert _node_fields(c) == _node_fields(py) and c.num_nodes == py.num_nodes
    assert c.num_tokens == py.num_tokens == sum(map(len, seqs))
    assert max(len(n.children or {}) for _, n in c.iter_nodes()) > 100
    for s in seqs:
        for ctx in (s[:50], s[:-1], np.array(s[:-2], dtype=np.int64)):
            for top_k in (1, 3):
                params = DraftParams(8, 1, 12, top_k, 0.0)
                assert draft(c, ctx, params) == draft(py, list(ctx), params)
    with pytest.raises(TypeError):
        draft(c, [1, "x"], DraftParams())


# ---- the compiled core is required ---------------------------------------------------------------

_BLOCK_CORE = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "seer.dgds.tree._suffix_core":
            raise ImportError("blocked for the test")
sys.meta_path.insert(0, Block())
"""
_STALE_CORE = """
import sys, types
fake = types.ModuleType("seer.dgds.tree._suffix_core")
fake.__file__ = "/nowhere/_suffix_core.so"
fake.Tree = object
fake.SOURCE_SHA256 = "0" * 64
sys.modules[fake.__name__] = fake
"""


def _import_tree(prelude: str, **env: str):
    import os
    import subprocess
    import sys

    code = prelude + "\nimport seer.dgds.tree.suffix_tree as s\nprint('COMPILED', s.COMPILED, s.SuffixTree(8).compiled)\n"
    full_env = {k: v for k, v in os.environ.items() if k != "SEER_DGDS_PURE_PYTHON"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**full_env, **env})


def test_a_missing_core_fails_the_import_and_names_the_fix():
    r = _import_tree(_BLOCK_CORE)
    assert r.returncode != 0
    assert "ImportError: seer.dgds.tree._suffix_core (the compiled suffix tree) is not built" in r.stderr
    assert "pip install -e ." in r.stderr and "SEER_DGDS_PURE_PYTHON=1" in r.stderr


def test_a_stale_core_fails_the_import():
    r = _import_tree(_STALE_CORE)
    assert r.returncode != 0
    assert "is stale: built from another version of _suffix_core.c (build 000000000000" in r.stderr
    assert "pip install -e ." in r.stderr


def test_pure_python_opt_in_gives_the_python_tree():
    r = _import_tree(_BLOCK_CORE, SEER_DGDS_PURE_PYTHON="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["COMPILED", "False", "False"]


def test_the_built_core_matches_its_source():
    import hashlib
    from pathlib import Path

    from seer.dgds.tree import _suffix_core, suffix_tree

    source = Path(suffix_tree.__file__).with_name("_suffix_core.c")
    assert _suffix_core.SOURCE_SHA256 == hashlib.sha256(source.read_bytes()).hexdigest()
    assert suffix_tree.COMPILED and SuffixTree(8).compiled


def _dump_with_refs(tree):
    """Every node in the core's layout: counts, lengths, edge references, sibling order."""
    return tree._c.dump()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=100), min_size=1, max_size=5),
       st.sampled_from([2, 3, 5, 16, 64]), st.integers(0, 10**6), st.integers(0, 400))
def test_a_lazy_tree_builds_the_eager_tree_when_first_read_and_then_follows_it(seqs, depth, seed, read_at):
    """A lazy tree (the draft server's) holds tokens and log only; its first read replays the log
    into the very nodes (edge references and sibling order included) an eager tree built token by
    token, and every later append keeps the two the same; its log answers as the eager one's all along."""
    from seer.dgds.tree.suffix_tree import log_fetch

    rng = random.Random(seed)
    eager, lazy = SuffixTree(depth, log=True), SuffixTree(depth, log=True, lazy=True)
    ids = [(eager.add_sequence(), lazy.add_sequence()) for _ in seqs]
    pos, sent = [0] * len(seqs), 0
    while any(p < len(s) for p, s in zip(pos, seqs)):
        i = rng.choice([i for i, s in enumerate(seqs) if pos[i] < len(s)])
        chunk = seqs[i][pos[i] : pos[i] + rng.randint(1, 12)]
        pos[i] += len(chunk)
        eager.extend(ids[i][0], chunk)
        lazy.extend(ids[i][1], chunk)
        sent += len(chunk)
        assert lazy.num_tokens == eager.num_tokens
        assert all(lazy.seq_len(a) == len(s) and lazy.seq_tokens(a, 1, len(s) - 1) == s[1:-1]
                   for (_, a), s in zip(ids, eager.seqs))
        assert log_fetch([lazy.core], [0], [0], 10**9) == log_fetch([eager.core], [0], [0], 10**9)
        if lazy.deferred and sent >= read_at:
            assert "seqs" not in vars(lazy)  # (its Python lists: not filled yet)
            assert lazy.count(()) == eager.num_tokens  # a read: the tree is built here
            assert not lazy.deferred
        if sent >= 2 * read_at:
            assert lazy.seqs == eager.seqs  # the lists, filled on this first read, then kept
        if not lazy.deferred:
            assert _dump_with_refs(lazy) == _dump_with_refs(eager)
    assert lazy.num_nodes == eager.num_nodes and not lazy.deferred
    assert _dump_with_refs(lazy) == _dump_with_refs(eager) and lazy.seqs == eager.seqs
    ctx = seqs[0][: len(seqs[0]) // 2]
    params = DraftParams(6, 1, 6, 2, 0.0)
    assert draft(lazy, ctx, params) == draft(eager, ctx, params)


def test_a_lazy_tree_is_built_by_whichever_read_comes_first():
    for read in (lambda t: t.count([1, 2]), lambda t: draft(t, [1, 2], DraftParams(4, 1, 4, 1, 0.0)),
                 lambda t: t.num_nodes, lambda t: t.root, lambda t: t.snapshot()):
        eager, lazy = SuffixTree(8, log=True), SuffixTree(8, log=True, lazy=True)
        for t in (eager, lazy):
            a, b = t.add_sequence(), t.add_sequence()
            t.extend(a, [1, 2, 3, 1, 2, 4])
            t.extend(b, [1, 2, 3])
            t.append_at(a, 6, bytes([1, 0, 0, 0, 2, 0, 0, 0]), 0, 2, 1000)
        assert lazy.deferred and lazy.num_tokens == 11
        read(lazy)
        assert not lazy.deferred and lazy.snapshot() == eager.snapshot()
    with pytest.raises(ValueError, match="log=True"):
        SuffixTree(8, lazy=True)  # a lazy tree without a log to replay
