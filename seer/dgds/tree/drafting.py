"""SuffixDecoding-style drafting from a group's suffix tree.

1. Match: the longest suffix of the context, ``pattern_lookup_min <= L <= pattern_lookup_max``,
   that occurs in the tree *and is followed by something* (a request's own context always occurs at
   the end of its own sequence, where nothing follows yet). Having a continuation is monotone in L,
   so a binary search finds it with O(log P) tree walks.
2. Walk: from the match, follow the most frequent continuations. Each token is scored by
   child count / parent count; the path's cumulative product is its probability, and the walk stops
   when that falls below ``min_token_prob`` or at ``max_spec_tokens``.
3. Multi-path (top_k > 1): a beam of width k over the same scores, returning up to k distinct
   branches, best first (Seer's multi-path drafting).

Ties break on the smaller token id so that equal trees (server and replica) give equal drafts.

A compiled tree (``SuffixTree.compiled``) drafts in C (``_suffix_core.Tree.draft``): the same three
steps, the same arithmetic, the same drafts; the functions below are the pure-Python reference.
"""

from __future__ import annotations

import sys
from typing import Sequence

from seer.dgds.tree.suffix_tree import Node, SuffixTree
from seer.dgds.types import DraftParams, DraftPath


def match_context(
    tree: SuffixTree, context: Sequence[int], lookup_min: int, lookup_max: int
) -> tuple[Node, int, int] | None:
    """(node, offset, match length) of the longest matching context suffix that continues."""
    hi = min(lookup_max, len(context), tree.max_depth - 1)
    lo = lookup_min
    if hi < lo:
        return None
    n = len(context)
    best: tuple[Node, int, int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        loc = tree.locate(context[n - mid :])
        if loc is not None and tree.continues(*loc):
            best = (loc[0], loc[1], mid)
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def _linear(tree: SuffixTree, node: Node, off: int, budget: int, floor: float) -> list[DraftPath]:
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    seqs = tree.seqs
    while len(tokens) < budget:
        if off < node.length:
            tokens.append(seqs[node.ref_seq][node.ref_idx + off])
            off += 1
        else:
            children = node.children
            if not children:
                break
            best_tok = -1
            best: Node | None = None
            for tok, child in children.items():
                if best is None or child.count > best.count or (
                    child.count == best.count and tok < best_tok
                ):
                    best, best_tok = child, tok
            assert best is not None
            p = prob * best.count / node.count
            if p < floor:
                break
            prob = p
            tokens.append(best_tok)
            node, off = best, 1
        probs.append(prob)
    return [DraftPath(tuple(tokens), tuple(probs))] if tokens else []


def _multi_path(
    tree: SuffixTree, node: Node, off: int, budget: int, floor: float, k: int
) -> list[DraftPath]:
    seqs = tree.seqs
    # beam entries: (prob, tokens, probs, node, offset)
    beams: list[tuple[float, list[int], list[float], Node, int]] = [(1.0, [], [], node, off)]
    done: list[tuple[list[int], list[float]]] = []
    for _ in range(budget):
        grown: list[tuple[float, list[int], list[float], Node, int]] = []
        for prob, toks, probs, nd, o in beams:
            if o < nd.length:
                tok = seqs[nd.ref_seq][nd.ref_idx + o]
                grown.append((prob, toks + [tok], probs + [prob], nd, o + 1))
                continue
            extended = False
            for tok, child in (nd.children or {}).items():
                p = prob * child.count / nd.count
                if p >= floor:
                    grown.append((p, toks + [tok], probs + [p], child, 1))
                    extended = True
            if not extended:
                done.append((toks, probs))
        if not grown:
            beams = []
            break
        grown.sort(key=lambda b: (-b[0], b[1]))
        beams = grown[:k]
    done.extend((toks, probs) for _, toks, probs, _, _ in beams)
    return _rank([DraftPath(tuple(t), tuple(p)) for t, p in done if t], k)


# The core ranks top-k paths by sum(probs) added left to right, which is what sum() does up to
# Python 3.11; later versions add floats with compensation, so there Python ranks the C paths.
_C_RANKS = sys.version_info < (3, 12)


def _rank(paths: list[DraftPath], k: int) -> list[DraftPath]:
    paths.sort(key=lambda d: (-d.score, d.tokens))
    return paths[:k]


def draft(tree: SuffixTree, context: Sequence[int], params: DraftParams) -> tuple[list[DraftPath], int]:
    """Draft paths for ``context`` (best first) and the matched suffix length (0: no match)."""
    core = tree._c
    if core is not None:
        if _C_RANKS or params.top_k == 1:
            return core.draft(context, params)
        paths, match_len = core.draft(context, params, False)
        return _rank(paths, params.top_k), match_len
    if params.max_spec_tokens <= 0:
        return [], 0
    m = match_context(tree, context, params.pattern_lookup_min, params.pattern_lookup_max)
    if m is None:
        return [], 0
    node, off, match_len = m
    budget = min(params.max_spec_tokens, tree.max_depth - match_len)
    if params.top_k == 1:
        paths = _linear(tree, node, off, budget, params.min_token_prob)
    else:
        paths = _multi_path(tree, node, off, budget, params.min_token_prob, params.top_k)
    return paths, match_len
