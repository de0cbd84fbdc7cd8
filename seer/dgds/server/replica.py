"""A client's local copy of one group's tree, built from its own appends and fetched increments.

The tree depends only on the multiset of sequences (its layout is canonical), so a replica can take
tokens from two sources in any order: the client's own requests, applied as soon as they are
generated, and the server's log, fetched incrementally. Each request's tokens are applied once, by
position: a segment the replica already covers is skipped, an overlapping one adds its tail.
"""

from __future__ import annotations

from typing import Sequence

from seer.dgds.tree.suffix_tree import SuffixTree
from seer.dgds.types import Segment


class ReplicaGap(Exception):
    """A segment starts past the end of what the replica holds for its request (a lost segment)."""


class GroupReplica:
    """Local tree of one group plus the server log offset it has consumed (its fetch cursor)."""

    def __init__(self, group_id: str, max_depth: int):
        self.group_id = group_id
        self.tree = SuffixTree(max_depth)
        self.request_index: dict[str, int] = {}
        self.cursor = 0

    def _seq(self, request_id: str) -> list[int]:
        idx = self.request_index.get(request_id)
        if idx is None:
            idx = self.tree.add_sequence()
            self.request_index[request_id] = idx
        return self.tree.seqs[idx]

    def length(self, request_id: str) -> int:
        idx = self.request_index.get(request_id)
        return 0 if idx is None else len(self.tree.seqs[idx])

    def tokens(self, request_id: str) -> list[int]:
        idx = self.request_index.get(request_id)
        return [] if idx is None else self.tree.seqs[idx]

    def append_local(self, request_id: str, tokens: Sequence[int]) -> None:
        """The client's own request generated ``tokens``: they extend that request's sequence."""
        self._seq(request_id)
        self.tree.extend(self.request_index[request_id], tokens)

    def apply_segment(self, seg: Segment) -> None:
        """Apply one fetched log segment, skipping whatever the replica already has."""
        have = len(self._seq(seg.request_id))
        if seg.start > have:
            raise ReplicaGap(f"{self.group_id}/{seg.request_id}: segment at {seg.start}, replica has {have}")
        new = seg.tokens[have - seg.start :]
        if new:
            self.tree.extend(self.request_index[seg.request_id], new)

    def apply_delta(self, start: int, next_cursor: int, segments: Sequence[Segment]) -> bool:
        """Apply a fetched increment if it starts at this replica's cursor; False if stale."""
        if start != self.cursor:
            return False
        for seg in segments:
            self.apply_segment(seg)
        self.cursor = next_cursor
        return True
