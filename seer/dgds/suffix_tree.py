"""Compressed, bounded-depth suffix tree over the token sequences of one GRPO group.

Every position of every sequence starts a *window*: the substring that begins there, cut at
``max_depth`` tokens. The tree is the path-compressed trie of all windows, and each node counts the
windows that pass through it, so ``count(w)`` is exactly the number of occurrences of ``w`` in the
group's sequences for ``len(w) <= max_depth``. That is the statistic SuffixDecoding drafts from:
P(next = x | w) = count(w + x) / count(w).

Appends are online (Arctic/SuffixDecoding style): each sequence keeps the nodes where its still
growing windows (the last ``max_depth`` starts) end, and each new token advances each of them by one
step, so an append costs O(max_depth) dictionary operations, whatever the size of the tree. The node
layout is canonical: nodes sit exactly at the root, at branch points and where some window ends, so
two trees fed the same sequences (in any interleaving) have the same nodes and counts; replicas rely
on that.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence


class Node:
    """A tree node; its edge is ``seqs[ref_seq][ref_idx : ref_idx + length]`` (root: empty)."""

    __slots__ = ("children", "parent", "count", "length", "ref_seq", "ref_idx")

    def __init__(self, parent: Node | None, count: int, length: int, ref_seq: int, ref_idx: int):
        self.children: dict[int, Node] | None = None  # None for leaves: most nodes are leaves
        self.parent = parent
        self.count = count
        self.length = length
        self.ref_seq = ref_seq
        self.ref_idx = ref_idx


class SuffixTree:
    """Suffix tree of a group: ``add_sequence`` per request, then ``extend`` it with new tokens."""

    def __init__(self, max_depth: int = 64):
        if max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        self.max_depth = max_depth
        self.root = Node(None, 0, 0, -1, -1)
        self.root.children = {}  # never None, so `children is None` means a non-root leaf
        self.seqs: list[list[int]] = []
        self._active: list[list[Node]] = []  # per sequence: where its growing windows end
        self.num_nodes = 1

    # ---- building -------------------------------------------------------------------------

    def add_sequence(self) -> int:
        """Start a new, empty sequence; returns its index."""
        self.seqs.append([])
        self._active.append([])
        return len(self.seqs) - 1

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append tokens to sequence ``seq_id``: O(len(tokens) * max_depth)."""
        seqs = self.seqs
        seq = seqs[seq_id]
        active = self._active[seq_id]
        root = self.root
        max_depth = self.max_depth
        created = 0
        for tok in tokens:
            n = len(seq)  # position of tok
            active.append(root)
            root.count += 1
            if len(active) > max_depth:
                del active[0]  # that window is max_depth long: it stops growing
            seq.append(tok)
            for i, node in enumerate(active):
                children = node.children
                if children is None:
                    if node.count == 1:
                        node.length += 1  # a leaf only this window reaches: grow it in place
                    else:
                        active[i] = new = Node(node, 1, 1, seq_id, n)
                        node.children = {tok: new}
                        created += 1
                    continue
                child = children.get(tok)
                if child is None:
                    # (a non-root node with children has count >= 2: this window ends here too)
                    active[i] = children[tok] = Node(node, 1, 1, seq_id, n)
                    created += 1
                elif node.count == child.count + 1 and node is not root:
                    # This window ends at `node`, and every other window through `node` continues
                    # with `tok`: the node boundary moves one token down.
                    if child.length == 1:
                        # The boundary reaches `child`: `child` absorbs `node`.
                        parent = node.parent
                        first = seqs[node.ref_seq][node.ref_idx]
                        child.count += 1
                        child.length = node.length + 1
                        child.ref_seq = seq_id
                        child.ref_idx = n + 1 - child.length
                        child.parent = parent
                        parent.children[first] = child  # type: ignore[index]
                        active[i] = child
                        created -= 1
                    else:
                        node.length += 1
                        node.ref_seq = seq_id
                        node.ref_idx = n + 1 - node.length
                        child.length -= 1
                        child.ref_idx += 1
                        head = seqs[child.ref_seq][child.ref_idx]
                        if head != tok:
                            del children[tok]  # type: ignore[arg-type]
                            children[head] = child  # type: ignore[index]
                elif child.length == 1:
                    child.count += 1
                    active[i] = child
                else:
                    # Split `child` after its first token; the window ends at the split point.
                    mid = Node(node, child.count + 1, 1, seq_id, n)
                    child.length -= 1
                    child.ref_idx += 1
                    child.parent = mid
                    mid.children = {seqs[child.ref_seq][child.ref_idx]: child}
                    children[tok] = mid  # type: ignore[index]
                    active[i] = mid
                    created += 1
        self.num_nodes += created

    # ---- queries --------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return self.root.count

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
        loc = self.locate(pattern)
        return 0 if loc is None else loc[0].count

    def continues(self, node: Node, off: int) -> bool:
        """Whether some occurrence of the located pattern is followed by another token."""
        return off < node.length or bool(node.children)

    def edge_token(self, node: Node, off: int) -> int:
        return self.seqs[node.ref_seq][node.ref_idx + off]

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
