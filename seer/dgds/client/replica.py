"""A client's local copy of one group's tree, built from its own appends and fetched increments.

The tree depends only on the multiset of sequences (its layout is canonical), so a replica can take
tokens from two sources in any order: the client's own requests, applied as soon as they are
generated, and the server's log, fetched incrementally. Each request's tokens are applied once, by
position: a segment the replica already covers is skipped, an overlapping one adds its tail.

With the compiled core a replica's tree is lazy (``SuffixTree(log=True, lazy=True)``): appends
keep the tokens and their log only, and the first draft from the group builds the tree from that
log (the same tree an eager one would hold). An instance then pays for the trees of the groups it
drafts from, not for those of every group it decodes (most of a rollout's bulk drafts nothing).
"""

from __future__ import annotations

from typing import Sequence

from seer.dgds.tree.suffix_tree import COMPILED, SuffixTree
from seer.dgds.types import Segment


class ReplicaGap(Exception):
    """A segment starts past the end of what the replica holds for its request (a lost segment)."""


class GroupReplica:
    """Local tree of one group plus the server log offset it has consumed (its fetch cursor)."""

    def __init__(self, group_id: str, max_depth: int, lazy: bool = True):
        self.group_id = group_id
        lazy = lazy and COMPILED  # (the Python tree has no lazy mode)
        self.tree = SuffixTree(max_depth, log=lazy, lazy=lazy)
        self.request_index: dict[str, int] = {}
        self.cursor = 0
        self.server_names: list[str] = []  # the group's request ids in the server's order (packed fetches)

    def reset_cursor(self) -> None:
        """Fetch the server's log again from the start (it lost the group, e.g. a restart)."""
        self.cursor = 0
        self.server_names = []

    def _seq(self, request_id: str) -> int:
        idx = self.request_index.get(request_id)
        if idx is None:
            idx = self.tree.add_sequence()
            self.request_index[request_id] = idx
        return idx

    def length(self, request_id: str) -> int:
        idx = self.request_index.get(request_id)
        return 0 if idx is None else self.tree.seq_len(idx)

    def tokens(self, request_id: str, start: int = 0) -> list[int]:
        """The request's tokens from ``start`` on (a lazy tree stays unbuilt)."""
        idx = self.request_index.get(request_id)
        return [] if idx is None else self.tree.seq_tokens(idx, start, self.tree.seq_len(idx))

    @property
    def built(self) -> bool:
        """Whether the tree exists (a lazy one is built by its first draft)."""
        return not self.tree.deferred

    def append_local(self, request_id: str, tokens: Sequence[int]) -> None:
        """The client's own request generated ``tokens``: they extend that request's sequence."""
        self.tree.extend(self._seq(request_id), tokens)

    def apply_segment(self, seg: Segment) -> None:
        """Apply one fetched log segment, skipping whatever the replica already has."""
        self._apply(seg.request_id, seg.start, seg.tokens)

    def _apply(self, request_id: str, start: int, tokens: Sequence[int]) -> int:
        """Tokens of the segment that were new here."""
        idx = self._seq(request_id)
        have = self.tree.seq_len(idx)
        if start > have:
            raise ReplicaGap(f"{self.group_id}/{request_id}: segment at {start}, replica has {have}")
        new = tokens[have - start :]
        if new:
            self.tree.extend(idx, new)
        return len(new)

    def apply_packed(self, start: int, next_cursor: int, known: int, names: Sequence[str], segments: Sequence[int],
                     tokens: Sequence[int]) -> bool:
        """Apply a packed increment (a Sync fetch answer): ``names`` are the group's request ids
        from index ``known`` on, ``segments`` flat (request index, start, length) triples, and
        ``tokens`` theirs, concatenated. False (nothing applied) if it is stale: it does not start
        at this replica's cursor, or was asked with another count of known names."""
        if start != self.cursor or known != len(self.server_names):
            return False
        self.server_names.extend(names)
        off = 0
        for k in range(0, len(segments), 3):
            n = segments[k + 2]
            self._apply(self.server_names[segments[k]], segments[k + 1], tokens[off : off + n])
            off += n
        self.cursor = next_cursor
        return True

    def apply_delta(self, start: int, next_cursor: int, segments: Sequence[Segment]) -> bool:
        """Apply a fetched increment if it starts at this replica's cursor; False if stale."""
        if start != self.cursor:
            return False
        for seg in segments:
            self.apply_segment(seg)
        self.cursor = next_cursor
        return True
