"""Compressed, bounded-depth suffix tree over the token sequences of one GRPO group.

Every position of every sequence starts a *window*: the substring that begins there, cut at
``max_depth`` tokens. The tree is the path-compressed trie of all windows, and each node counts the
windows that pass through it, so ``count(w)`` is exactly the number of occurrences of ``w`` in the
group's sequences for ``len(w) <= max_depth``. That is the statistic SuffixDecoding drafts from:
P(next = x | w) = count(w + x) / count(w).

Appends are online (Arctic/SuffixDecoding style): each sequence keeps the nodes where its still
growing windows (the last ``max_depth`` starts) end, and each new token advances each of them by one
step, so an append costs O(max_depth) dictionary operations, whatever the size of the tree; windows
that already sit in a leaf of their own grow for free (see ``SuffixTree.extend``), so in practice
it costs about as many steps as the current match length. The node layout is canonical: nodes sit
exactly at the root, at branch points and where some window ends, so two trees fed the same
sequences (in any interleaving) have the same nodes and counts; replicas rely on that.

With the compiled core (``_suffix_core.c``, built by ``pip install -e .``) the whole tree lives in
C: the same nodes and counts in plain arrays, and ``extend`` and drafting (``drafting.draft``) run
there; ``root``, ``iter_nodes`` and ``locate`` then read a Python view of it (``Node`` objects made
from the C tree on demand: introspection, not the hot path). ``_extend`` below and drafting.py are
the same algorithms in Python, the reference; tests compare both, node for node and draft for draft.

The core is required. A missing or stale build (an .so compiled from another ``_suffix_core.c``:
setup.py compiles the source's SHA-256 into it) makes this import fail with the fix in the message,
because silently running the Python tree is a several-fold slowdown nobody asked for. Setting
``SEER_DGDS_PURE_PYTHON=1`` opts into the Python tree (same trees and drafts, slower), e.g. where
no C compiler is available.
"""

from __future__ import annotations

import hashlib
import os
import sys
from array import array
from bisect import bisect_right
from pathlib import Path
from typing import Iterable, Iterator, Sequence

MAX_DEPTH = 64  # the default suffix-tree depth (DGDSConfig.max_depth reads it): the longest context a draft is matched on


class Node:
    """A tree node; its edge is ``seqs[ref_seq][ref_idx : ref_idx + length]`` (root: empty).

    ``parent`` is read by ``SuffixTree._extend`` only. A compiled tree has no ``Node`` objects of its
    own: its ``root`` is a view made of them (see ``SuffixTree.root``).
    """

    __slots__ = ("children", "parent", "count", "length", "ref_seq", "ref_idx", "growing")

    def __init__(self, parent: Node | None, count: int, length: int, ref_seq: int, ref_idx: int):
        self.children: dict[int, Node] | None = None  # None for leaves: most nodes are leaves
        self.parent = parent
        self.count = count
        self.length = length
        self.ref_seq = ref_seq
        self.ref_idx = ref_idx
        # An open leaf: the only window through it is still growing (nodes are only ever created
        # with count 1 as a window's new leaf; SuffixTree.extend clears it when that changes).
        self.growing = count == 1


PURE_PYTHON_ENV = "SEER_DGDS_PURE_PYTHON"
_SOURCE = Path(__file__).with_name("_suffix_core.c")
_REBUILD = ("rebuild it with `pip install -e .` (or `make install`), or set SEER_DGDS_PURE_PYTHON=1 "
            "to use the pure-Python tree (same trees and drafts, several times slower)")


def _load_core():
    """The compiled core, or None under ``SEER_DGDS_PURE_PYTHON=1``; ImportError if missing or stale."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        return None
    try:
        from seer.dgds.tree import _suffix_core
    except ImportError as e:
        raise ImportError(f"seer.dgds.tree._suffix_core (the compiled suffix tree) is not built or does "
                          f"not load ({e}): {_REBUILD}") from e
    built = getattr(_suffix_core, "SOURCE_SHA256", None)
    # Installed without the C source (a wheel): the build is what was shipped, nothing to compare.
    expected = hashlib.sha256(_SOURCE.read_bytes()).hexdigest() if _SOURCE.exists() else built
    if built != expected or not hasattr(_suffix_core, "Tree"):
        raise ImportError(f"seer.dgds.tree._suffix_core at {_suffix_core.__file__} is stale: built from "
                          f"another version of {_SOURCE.name} (build {str(built)[:12]}, source "
                          f"{str(expected)[:12]}): {_REBUILD}", name=_suffix_core.__name__)
    from seer.dgds.types import DraftPath

    _suffix_core.bind(DraftPath)
    return _suffix_core


_CORE = _load_core()
COMPILED = _CORE is not None  # False only under SEER_DGDS_PURE_PYTHON=1


class SuffixTree:
    """Suffix tree of a group: ``add_sequence`` per request, then ``extend`` it with new tokens.

    ``compiled``: keep the tree in the C core (the default unless ``SEER_DGDS_PURE_PYTHON=1``) or
    in Python ``Node`` objects; both hold the very same tree and draft the very same tokens.
    ``log``: also keep the append log (the draft server's trees): every extend call is a segment
    (sequence, start, length) and its tokens, which ``log_fetch`` hands out; token ids must then
    be in [0, 2**32). ``append_at`` appends from a packed buffer (see ``_suffix_core.c``).
    ``lazy`` (with ``log``, compiled only): keep just the tokens and the log until the tree is first
    read (a draft, ``count``, ``root``, ``num_nodes``), then build it from the log: the same tree,
    paid for only by a server that drafts from it (``deferred`` says whether it is still unbuilt).
    """

    def __init__(self, max_depth: int = MAX_DEPTH, compiled: bool | None = None, log: bool = False, lazy: bool = False):
        if max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        if lazy and not log:
            raise ValueError("a lazy tree needs log=True (it is built by replaying its log)")
        if compiled and not COMPILED:
            raise RuntimeError(f"a compiled tree was asked for, but {PURE_PYTHON_ENV}=1 is set")
        self.max_depth = max_depth
        self._c = None
        if COMPILED and compiled is not False:
            self._c = c = _CORE.Tree(max_depth, log=log, lazy=lazy)
            if not lazy:  # (a lazy tree's lists are filled when first read: see __getattr__)
                self.seqs: list[list[int]] = c.seqs  # kept by the core (read only)
            self.seq_len = c.seq_len  # type: ignore[method-assign]
            self.seq_tokens = c.seq_tokens  # type: ignore[method-assign]
            # The core's own methods, bound on the instance: an append costs no Python frame.
            self.extend = c.extend  # type: ignore[method-assign]
            self.add_sequence = c.add_sequence  # type: ignore[method-assign]
            self.append_at = c.append_at  # type: ignore[method-assign]
            self.core = c  # what log_fetch takes
            self._view: tuple[int, Node] | None = None  # (core version, root of the Python view)
            return
        self.core = self
        self._root = Node(None, 0, 0, -1, -1)
        self._root.children = {}  # never None, so `children is None` means a non-root leaf
        self.seqs = []
        self._active: list[list[Node]] = []  # per sequence: where its growing windows end
        self._open: list[int] = []  # per sequence: how many of them (the oldest) are open leaves
        self._num_nodes = 1
        # the log: segment k is _log_seg[3k : 3k + 3], its tokens end at _log_end[k] in _log_tok
        self._log = log
        self._log_seg: list[int] = []
        self._log_end: list[int] = []
        self._log_tok = array("I")

    @property
    def log_size(self) -> int:
        """Segments in the append log."""
        return self._c.log_size if self._c is not None else len(self._log_end)

    def append_at(self, seq_id: int, prev: int, buf: bytes, off: int, n: int, max_tokens: int) -> int:
        """Append tokens [off, off + n) of ``buf`` (packed little-endian uint32) to sequence
        ``seq_id`` if it holds exactly ``prev`` tokens, ``n > 0`` and the tree stays within
        ``max_tokens``: its new length; otherwise nothing changes: -1 (-2: over max_tokens)."""
        seq = self.seqs[seq_id]
        if n <= 0 or prev != len(seq):
            return -1
        if self.num_tokens + n > max_tokens:
            return -2
        if off < 0 or 4 * (off + n) > len(buf):
            raise ValueError("append_at: [off, off + n) outside the buffer")
        tokens = array("I", bytes(buf[4 * off : 4 * (off + n)]))
        if sys.byteorder != "little":  # pragma: no cover
            tokens.byteswap()
        self.extend(seq_id, tokens.tolist())
        return len(seq)

    @property
    def compiled(self) -> bool:
        return self._c is not None

    @property
    def root(self) -> Node:
        """The root node. For a compiled tree, a Python copy of the C tree, made when first asked
        for after an append (O(nodes): tests and tools, not the hot path)."""
        c = self._c
        if c is None:
            return self._root
        if self._view is None or self._view[0] != c.version:
            rows = c.dump()  # (builds a lazy tree first, which bumps its version)
            self._view = (c.version, self._build_view(rows))
        return self._view[1]

    def _build_view(self, rows: list[tuple[int, int, int, int, int, int]]) -> Node:
        seqs = self.seqs
        nodes: list[Node] = []
        for parent_pos, count, length, ref_seq, ref_idx, growing in rows:
            parent = nodes[parent_pos] if parent_pos >= 0 else None
            node = Node(parent, count, length, ref_seq, ref_idx)
            node.growing = bool(growing)
            if parent is not None:
                if parent.children is None:
                    parent.children = {}
                parent.children[seqs[ref_seq][ref_idx]] = node
            nodes.append(node)
        nodes[0].children = nodes[0].children or {}
        return nodes[0]

    @property
    def deferred(self) -> bool:
        """A lazy tree not built yet: it holds tokens and log, no nodes."""
        return self._c is not None and self._c.deferred

    @property
    def num_nodes(self) -> int:
        return self._c.num_nodes if self._c is not None else self._num_nodes

    def __getattr__(self, name: str):
        # Only for what __init__ left unset: a lazy tree's ``seqs``, which the core fills on this
        # first read (and keeps from then on, as any tree's).
        if name == "seqs" and self.__dict__.get("_c") is not None:
            self.seqs = seqs = self._c.seqs
            return seqs
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def seq_len(self, seq_id: int) -> int:
        """Sequence ``seq_id``'s length (read without filling a lazy tree's lists)."""
        return len(self.seqs[seq_id])

    def seq_tokens(self, seq_id: int, start: int, stop: int) -> list[int]:
        """Sequence ``seq_id``'s tokens [start, stop), as a slice (a lazy tree's lists stay unfilled)."""
        return self.seqs[seq_id][start:stop]

    # ---- building -------------------------------------------------------------------------

    def add_sequence(self) -> int:
        """Start a new, empty sequence; returns its index."""
        self.seqs.append([])
        self._active.append([])
        self._open.append(0)
        return len(self.seqs) - 1

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append tokens to sequence ``seq_id``: O(len(tokens) * max_depth) at worst.

        The windows of a sequence that already reach a leaf of their own (count 1) only grow, and
        they are always its oldest ones: if ``s[j:]`` occurs once, so does every ``s[j':]`` with
        ``j' < j``. Like Ukkonen's open leaves, such a leaf's edge ends where the sequence ends, so
        its length is ``len(seq) - ref_idx`` without touching it; each token only walks the other
        windows (those whose text occurred before: about as many as the current match length), and
        the open leaves' ``length`` fields are written once, when the call returns. Another
        sequence's appends can repeat an open leaf's text (its count becomes 2); that only shortens
        the open prefix, which is checked again at the next call.
        """
        seq = self.seqs[seq_id]
        start = len(seq)
        if self._log:
            tokens = list(tokens)
            if any(not 0 <= t < 1 << 32 for t in tokens):
                raise ValueError("a logged tree takes token ids in [0, 2**32)")
        active = self._active[seq_id]
        lo = self._open[seq_id]  # active[:lo] are open leaves (growing, count 1)
        # Other sequences may have repeated some of them since (count 2 now): still a prefix.
        while lo and active[lo - 1].count != 1:
            lo -= 1
        try:
            lo = self._extend(seq_id, seq, active, lo, tokens)
        finally:
            end = len(seq)
            for leaf in active[:lo]:
                leaf.length = end - leaf.ref_idx
            self._open[seq_id] = lo
            if self._log and end > start:
                self._log_seg += (seq_id, start, end - start)
                self._log_tok.extend(seq[start:end])
                self._log_end.append(len(self._log_tok))

    def _extend(self, seq_id: int, seq: list[int], active: list[Node], lo: int, tokens: Iterable[int]) -> int:
        seqs = self.seqs
        root = self._root
        max_depth = self.max_depth
        created = 0
        try:
            for tok in tokens:
                n = len(seq)  # position of tok
                active.append(root)
                root.count += 1
                if len(active) > max_depth:
                    # The oldest window is max_depth long: it stops growing.
                    if lo:
                        old = active[0]
                        old.length = n - old.ref_idx
                        old.growing = False
                        lo -= 1
                    del active[0]
                seq.append(tok)
                end = n + 1
                for i in range(lo, len(active)):
                    node = active[i]
                    children = node.children
                    if children is None:
                        # a leaf other windows ended at too (count >= 2): this window branches off
                        active[i] = new = Node(node, 1, 1, seq_id, n)
                        node.children = {tok: new}
                        created += 1
                        continue
                    child = children.get(tok)
                    if child is None:
                        # (a non-root node with children has count >= 2: this window ends here too)
                        active[i] = children[tok] = Node(node, 1, 1, seq_id, n)
                        created += 1
                        continue
                    clen = child.length
                    if child.growing and child.ref_seq == seq_id:
                        clen = end - child.ref_idx  # an open leaf of this sequence: not written yet
                    if node.count == child.count + 1 and node is not root:
                        # This window ends at `node`, and every other window through `node`
                        # continues with `tok`: the node boundary moves one token down.
                        if clen == 1:
                            # The boundary reaches `child`: `child` absorbs `node`.
                            parent = node.parent
                            first = seqs[node.ref_seq][node.ref_idx]
                            child.count += 1
                            child.length = node.length + 1
                            child.ref_seq = seq_id
                            child.ref_idx = end - child.length
                            child.parent = parent
                            child.growing = False
                            parent.children[first] = child  # type: ignore[index]
                            active[i] = child
                            created -= 1
                        else:
                            length = node.length + 1
                            node.length = length
                            node.ref_seq = seq_id
                            node.ref_idx = end - length
                            child.length = clen - 1
                            idx = child.ref_idx + 1
                            child.ref_idx = idx
                            head = seqs[child.ref_seq][idx]
                            if head != tok:
                                del children[tok]
                                children[head] = child
                    elif clen == 1:
                        child.count += 1
                        child.growing = False
                        active[i] = child
                    else:
                        # Split `child` after its first token; the window ends at the split point.
                        mid = Node(node, child.count + 1, 1, seq_id, n)
                        child.length = clen - 1
                        child.ref_idx += 1
                        child.parent = mid
                        mid.children = {seqs[child.ref_seq][child.ref_idx]: child}
                        children[tok] = mid
                        active[i] = mid
                        created += 1
                # Windows that now reached a leaf of their own join the open prefix.
                while lo < len(active) and active[lo].count == 1:
                    lo += 1
        finally:
            self._num_nodes += created
        return lo

    # ---- queries --------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return self._c.num_tokens if self._c is not None else self._root.count

    def locate(self, pattern: Sequence[int]) -> tuple[Node, int] | None:
        """Where ``pattern`` ends in the tree: (node, tokens of node's edge consumed), or None.

        Costs O(number of nodes on the path) Python steps; edges are compared as slices.
        """
        node = self.root
        off = 0
        i = 0
        m = len(pattern)
        seqs = self.seqs
        while i < m:
            if off == node.length:
                children = node.children
                if children is None:
                    return None
                child = children.get(pattern[i])
                if child is None:
                    return None
                node = child
                off = 0
            take = min(node.length - off, m - i)
            start = node.ref_idx + off
            if take == 1:
                if seqs[node.ref_seq][start] != pattern[i]:
                    return None
            elif seqs[node.ref_seq][start : start + take] != list(pattern[i : i + take]):
                return None
            off += take
            i += take
        return node, off

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` in the group's sequences (exact while len <= max_depth)."""
        if self._c is not None:
            return self._c.count(pattern)
        loc = self.locate(pattern)
        return 0 if loc is None else loc[0].count

    def continues(self, node: Node, off: int) -> bool:
        """Whether some occurrence of the located pattern is followed by another token."""
        return off < node.length or bool(node.children)

    # ---- introspection (tests, replicas, metrics) ------------------------------------------

    def iter_nodes(self) -> Iterator[tuple[tuple[int, ...], Node]]:
        """Every node with the token path from the root to its end."""
        stack: list[tuple[tuple[int, ...], Node]] = [((), self.root)]
        while stack:
            path, node = stack.pop()
            yield path, node
            for child in (node.children or {}).values():
                edge = self.seqs[child.ref_seq][child.ref_idx : child.ref_idx + child.length]
                stack.append((path + tuple(edge), child))

    def snapshot(self) -> dict[tuple[int, ...], int]:
        """Canonical content: node path -> count. Equal trees have equal snapshots."""
        return {path: node.count for path, node in self.iter_nodes()}


def _py_log_fetch(trees: Sequence[SuffixTree | None], cursors: Sequence[int], known: Sequence[int],
                  max_tokens: int) -> tuple[list[int], list[int], list[int], list[int], bytes, bytes]:
    """``_suffix_core.log_fetch`` for pure-Python logged trees (the reference; same answers)."""
    if not len(trees) == len(cursors) == len(known):
        raise ValueError("trees, cursors and known differ in length")
    for i, (t, c, k) in enumerate(zip(trees, cursors, known)):
        if t is not None and not (0 <= c <= len(t._log_end) and 0 <= k <= len(t.seqs)):
            raise ValueError(f"fetch {i}: cursor {c} or known {k} outside the tree "
                             f"(log 0..{len(t._log_end)}, {len(t.seqs)} sequences)")
    nxt, nseg, nnew, more = [], [], [], []
    segs, toks = array("I"), array("I")
    left = max_tokens
    for i, (t, c, k) in enumerate(zip(trees, cursors, known)):
        nnew.append(0 if t is None else len(t.seqs) - k)
        if t is None or c == len(t._log_end):
            nxt.append(c)
            nseg.append(0)
            continue
        ends = t._log_end
        t0 = ends[c - 1] if c else 0
        e = len(ends)
        if ends[-1] - t0 > left:
            e = max(c + 1, bisect_right(ends, t0 + left, c))
            more.append(i)
        nxt.append(e)
        nseg.append(e - c)
        segs.extend(t._log_seg[3 * c : 3 * e])
        toks.extend(t._log_tok[t0 : ends[e - 1]])
        left = max(1, left - (ends[e - 1] - t0))
    if sys.byteorder != "little":  # pragma: no cover
        segs.byteswap()
        toks.byteswap()
    return nxt, nseg, nnew, more, segs.tobytes(), toks.tobytes()


# log_fetch(trees, cursors, known, max_tokens) -> (next, segments, new_requests, more, segs, toks):
# for each logged tree (its ``core``; None: answered empty) what a replica at log offset cursors[i]
# lacks, within max_tokens over all, as packed little-endian uint32 bytes (see _suffix_core.c).
log_fetch = _CORE.log_fetch if COMPILED else _py_log_fetch
# sync_packed(raw, states, groups, ended, now, limits) -> bytes | None: GroupStore.sync of one serialized
# SyncRequest, answered serialized (see _suffix_core.c); None without the core.
sync_packed = _CORE.sync_packed if COMPILED else None
