"""The draft server's state: registered groups, their trees, TTLs and append logs (no gRPC here).

Each group keeps one suffix tree over all its requests, plus an append log of (request, start,
length) segments in the order the server applied them, kept by the tree itself (packed, in C). A
client's replica is "the log up to offset c"; ``fetch`` returns the segments after c, so
increments cost what is new, not the tree. ``sync`` takes one packed message of many groups'
appends and fetches and answers it with one C call for all the fetches and one per in-order
append (``log_fetch``, ``SuffixTree.append_at``): that is what lets one server core feed every
replica of every group.

Updates carry ``prev_token_count`` (how many tokens of that request precede the batch), which makes
them idempotent and reorder-safe: a batch the server already has is acknowledged and dropped, an
overlapping one contributes only its new tail, and one that arrives ahead of a gap waits (bounded)
until the gap fills.
"""

from __future__ import annotations

import enum
import sys
import threading
from array import array
from collections import OrderedDict
import time
from dataclasses import InitVar, dataclass, field
from typing import Callable, Sequence

from seer.dgds.tree.drafting import draft
from seer.dgds.tree.suffix_tree import SuffixTree, log_fetch, sync_packed
from seer.dgds.types import Draft, DraftParams, Segment


class DgdsError(Exception):
    """Base of the errors the server maps to gRPC status codes."""


class UnknownGroups(DgdsError):
    """Some named groups are not registered (never, finished, or expired) -> NOT_FOUND.

    ``ended`` lists those the server knows were finished or expired (recent ones): clients drop
    them, while a group that is simply unknown (e.g. the server restarted) may be registered again.
    """

    def __init__(self, group_ids: Sequence[str], ended: Sequence[str] = ()):
        self.group_ids = list(dict.fromkeys(group_ids))
        self.ended = [g for g in self.group_ids if g in set(ended)]
        super().__init__("unknown group(s): " + ", ".join(self.group_ids[:10]))


class Malformed(DgdsError):
    """The request cannot be valid in any state -> INVALID_ARGUMENT."""


class TooLarge(DgdsError):
    """The request exceeds a configured limit -> RESOURCE_EXHAUSTED."""


@dataclass(frozen=True)
class Limits:
    """Bounds that keep one misbehaving client from exhausting the server."""

    max_groups: int = 100_000
    max_tokens_per_update: int = 65_536
    max_updates_per_call: int = 4_096
    max_tokens_per_group: int = 16_000_000
    max_pending_per_request: int = 64
    max_rows_per_speculate: int = 4_096
    max_context_tokens: int = 1_000_000
    max_spec_tokens: int = 256
    max_top_k: int = 16
    max_id_len: int = 256
    max_ttl_seconds: float = 7 * 24 * 3600.0
    max_fetch_tokens: int = 4_000_000


class UpdateStatus(enum.IntEnum):
    """Outcome of one update (values match the proto enum)."""

    APPLIED = 1  # new tokens went into the tree (possibly after dropping an overlap)
    DUPLICATE = 2  # the server had all of them already
    BUFFERED = 3  # arrived ahead of a gap; applied once the gap fills
    CONFLICT = 4  # overlaps tokens the server has, with different values; dropped
    UNKNOWN_GROUP = 5  # sync only: the group is not registered; nothing applied


@dataclass(frozen=True)
class Update:
    group_id: str
    request_id: str
    prev_token_count: int
    tokens: Sequence[int]


@dataclass(frozen=True)
class UpdateOutcome:
    status: UpdateStatus
    committed_token_count: int  # the request's contiguous tokens on the server after this update


@dataclass(frozen=True)
class GroupDelta:
    """What a replica at log offset ``start`` is missing (possibly cut short: ``more``)."""

    group_id: str
    max_depth: int
    start: int
    next: int
    segments: list[Segment]
    more: bool


def u32(values=()) -> array:
    """A flat uint32 array (the packed wire format's token and segment arrays)."""
    return array("I", values)


if u32().itemsize != 4:  # pragma: no cover - every platform CPython supports has a 4-byte C int
    raise ImportError("seer.dgds needs a 4-byte array('I')")
LITTLE_ENDIAN = sys.byteorder == "little"


def unpack_u32(data: bytes) -> array:
    """Little-endian uint32 bytes (the wire format) as an array."""
    if len(data) % 4:
        raise Malformed("packed uint32 field of a length that is not a multiple of 4")
    out = u32()
    out.frombytes(data)
    if not LITTLE_ENDIAN:  # pragma: no cover
        out.byteswap()
    return out


def pack_u32(values: array) -> bytes:
    """An array('I') as little-endian bytes."""
    if LITTLE_ENDIAN:
        return values.tobytes()
    swapped = array("I", values)  # pragma: no cover
    swapped.byteswap()  # pragma: no cover
    return swapped.tobytes()  # pragma: no cover


@dataclass(frozen=True)
class SyncBatch:
    """One packed sync message (see protos/dgds.proto, SyncRequest): appends, then fetches, of
    groups named once in ``group_ids`` and referred to by index; tokens flat, in order."""

    group_ids: Sequence[str] = ()
    request_ids: Sequence[str] = ()
    append_group: Sequence[int] = ()
    append_prev: Sequence[int] = ()
    append_len: Sequence[int] = ()
    tokens: bytes = b""  # little-endian uint32, the appends' tokens in order
    fetch_group: Sequence[int] = ()
    fetch_cursor: Sequence[int] = ()
    fetch_known: Sequence[int] = ()
    max_tokens: int = 0


@dataclass
class SyncResult:
    """The answer to a SyncBatch (see SyncResponse): per append a status and committed count, per
    fetch the next cursor and how many segments and new request ids of ``segments`` /
    ``request_ids`` are its; ``unknown`` / ``ended`` index ``group_ids``."""

    append_status: bytearray
    committed: list[int]
    fetch_next: list[int] = field(default_factory=list)
    fetch_segments: list[int] = field(default_factory=list)
    fetch_new_requests: list[int] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    segments: bytes = b""  # little-endian uint32 (request index, start, length) triples
    tokens: bytes = b""  # little-endian uint32
    more: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)


@dataclass
class GroupState:
    """One group: its tree, the request -> sequence map, the append log and its lease.

    The log lives in the tree (``SuffixTree(log=True)``): every extend of it is a segment, which
    ``log_fetch`` hands out packed. So does the lease (``ttl``, ``expires_at``: the tree's core
    holds them), which the compiled Sync then renews with no Python call per append.
    """

    group_id: str
    tree: SuffixTree
    lease_ttl: InitVar[float]
    lease_expires_at: InitVar[float]
    request_index: dict[str, int] = field(default_factory=dict)
    request_ids: list[str] = field(default_factory=list)
    pending: dict[int, dict[int, tuple[int, ...]]] = field(default_factory=dict)

    def __post_init__(self, lease_ttl: float, lease_expires_at: float) -> None:
        self.ttl, self.expires_at = lease_ttl, lease_expires_at

    @property
    def ttl(self) -> float:
        return self.tree.core.ttl

    @ttl.setter
    def ttl(self, value: float) -> None:
        self.tree.core.ttl = value

    @property
    def expires_at(self) -> float:
        return self.tree.core.expires_at

    @expires_at.setter
    def expires_at(self, value: float) -> None:
        self.tree.core.expires_at = value

    def seq_of(self, request_id: str) -> int:
        idx = self.request_index.get(request_id)
        if idx is None:
            idx = self.tree.add_sequence()
            self.request_index[request_id] = idx
            self.request_ids.append(request_id)
        return idx

    def apply(self, request_id: str, prev: int, tokens: Sequence[int], limits: Limits) -> tuple[UpdateStatus, int]:
        """(status, the request's contiguous tokens on the server now)."""
        idx = self.request_index.get(request_id)
        if idx is None:
            idx = self.seq_of(request_id)
        seq_len = self.tree.seq_len  # (not tree.seqs: that would fill a lazy tree's Python lists)
        if prev > seq_len(idx):
            waiting = self.pending.setdefault(idx, {})
            if prev not in waiting and len(waiting) >= limits.max_pending_per_request:
                raise TooLarge(f"request {request_id!r}: too many out-of-order batches pending")
            waiting[prev] = tuple(tokens)
            return UpdateStatus.BUFFERED, seq_len(idx)
        status = self._append(idx, prev, tokens, limits)
        waiting = self.pending.get(idx)
        while waiting:
            ready = [p for p in waiting if p <= seq_len(idx)]
            if not ready:
                break
            p = min(ready)
            self._append(idx, p, waiting.pop(p), limits)
        if waiting is not None and not waiting:
            del self.pending[idx]
        return status, seq_len(idx)

    def _append(self, idx: int, prev: int, tokens: Sequence[int], limits: Limits) -> UpdateStatus:
        overlap = self.tree.seq_len(idx) - prev
        if self.tree.seq_tokens(idx, prev, prev + min(overlap, len(tokens))) != list(tokens[:overlap]):
            return UpdateStatus.CONFLICT
        new = tokens[overlap:]
        if not new:
            return UpdateStatus.DUPLICATE
        if self.tree.num_tokens + len(new) > limits.max_tokens_per_group:
            raise TooLarge(f"group {self.group_id!r} would exceed {limits.max_tokens_per_group} tokens")
        self.tree.extend(idx, new)
        return UpdateStatus.APPLIED

    def delta(self, start: int, max_tokens: int) -> GroupDelta:
        try:
            [end], _, _, more, segs, toks = log_fetch([self.tree.core], [start], [0], max_tokens)
        except ValueError:
            raise Malformed(f"group {self.group_id!r}: cursor {start} outside the log (0..{self.tree.log_size})") from None
        segs, toks, names = unpack_u32(segs), unpack_u32(toks), self.request_ids
        segments, t0 = [], 0
        for k in range(0, len(segs), 3):
            n = segs[k + 2]
            segments.append(Segment(names[segs[k]], segs[k + 1], tuple(toks[t0 : t0 + n])))
            t0 += n
        return GroupDelta(self.group_id, self.tree.max_depth, start, end, segments, bool(more))


def _check_id(kind: str, value: str, limits: Limits) -> None:
    if not value:
        raise Malformed(f"{kind} must be non-empty")
    if len(value) > limits.max_id_len:
        raise Malformed(f"{kind} longer than {limits.max_id_len} characters")


def check_params(params: DraftParams, limits: Limits) -> None:
    problem = params.problem()
    if problem:
        raise Malformed(problem)
    if params.max_spec_tokens > limits.max_spec_tokens:
        raise TooLarge(f"max_spec_tokens above {limits.max_spec_tokens}")
    if params.top_k > limits.max_top_k:
        raise TooLarge(f"top_k above {limits.max_top_k}")


class GroupStore:
    """Thread-safe registry of groups. One lock: Python runs one thread at a time anyway, and a
    single lock keeps every operation atomic with respect to TTL expiry.

    ``lazy_trees``: a group's tree is built on the first server-side draft (``speculate``) from its
    log, not token by token as appends come. Clients that keep replicas (every Seer instance) draft
    from those and never ask, so the server only keeps logs; a client that does ask pays for the
    build once, then the tree follows every append."""

    def __init__(self, max_depth: int = 64, limits: Limits = Limits(), clock: Callable[[], float] = time.monotonic,
                 lazy_trees: bool = True):
        if max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        self.max_depth = max_depth
        self.lazy_trees = lazy_trees
        self.limits = limits
        self.clock = clock
        self._groups: dict[str, GroupState] = {}
        self._cores: dict[str, object] = {}  # group id -> its tree's core (what log_fetch takes)
        # group id -> (state, core, request_index, pending, request_ids): what sync_packed reads
        self._fast: dict[str, tuple] = {}
        self._epoch = 0  # bumped whenever a group is added or dropped: what a connection's lookup cache checks
        self._lock = threading.Lock()
        self.expired_total = 0
        self._ended: OrderedDict[str, None] = OrderedDict()  # recently finished/expired ids
        self._max_ended = 100_000

    # ---- lifecycle ---------------------------------------------------------------------

    def register(self, group_id: str, ttl_seconds: float, resume: bool = False) -> int:
        """Create the group or refresh its lease; returns the tree depth replicas must use.
        ``resume``: only if the group did not end (finish/expiry) recently."""
        _check_id("group_id", group_id, self.limits)
        if not ttl_seconds > 0:
            raise Malformed("ttl_seconds must be > 0")
        if ttl_seconds > self.limits.max_ttl_seconds:
            raise TooLarge(f"ttl_seconds above {self.limits.max_ttl_seconds}")
        with self._lock:
            now = self.clock()
            g = self._live(group_id, now)
            if g is None:
                if resume and group_id in self._ended:
                    raise UnknownGroups([group_id], [group_id])
                if len(self._groups) >= self.limits.max_groups:
                    self._reap_locked(now)
                if len(self._groups) >= self.limits.max_groups:
                    raise TooLarge(f"server holds the maximum of {self.limits.max_groups} groups")
                g = GroupState(group_id, SuffixTree(self.max_depth, log=True, lazy=self.lazy_trees), ttl_seconds, now + ttl_seconds)
                self._groups[group_id] = g
                self._cores[group_id] = g.tree.core
                self._fast[group_id] = (g, g.tree.core, g.request_index, g.pending, g.request_ids)
                self._epoch += 1
                self._ended.pop(group_id, None)
            else:
                g.ttl = ttl_seconds
                g.expires_at = now + ttl_seconds
            return g.tree.max_depth

    def finish(self, group_id: str) -> None:
        """Free a group now (its requests are done)."""
        _check_id("group_id", group_id, self.limits)
        with self._lock:
            if self._live(group_id, self.clock()) is None:
                raise UnknownGroups([group_id])
            self._drop(group_id)

    def forget_all(self) -> None:
        """Lose every group as a restarted server has (not remembered as ended: clients that
        still hold them register them again and resend)."""
        with self._lock:
            self._groups.clear()
            self._cores.clear()
            self._fast.clear()
            self._epoch += 1

    def _drop(self, group_id: str) -> None:
        """Forget a group that finished or expired (remembered as ended)."""
        del self._groups[group_id]
        self._cores.pop(group_id, None)
        self._fast.pop(group_id, None)
        self._epoch += 1
        self._ended[group_id] = None
        self._ended.move_to_end(group_id)
        while len(self._ended) > self._max_ended:
            self._ended.popitem(last=False)

    def reap(self) -> int:
        """Free every expired group; returns how many."""
        with self._lock:
            return self._reap_locked(self.clock())

    def _reap_locked(self, now: float) -> int:
        dead = [gid for gid, g in self._groups.items() if g.expires_at <= now]
        for gid in dead:
            self._drop(gid)
        self.expired_total += len(dead)
        return len(dead)

    def _live(self, group_id: str, now: float) -> GroupState | None:
        g = self._groups.get(group_id)
        if g is not None and g.expires_at <= now:
            self._drop(group_id)
            self.expired_total += 1
            return None
        return g

    def _require(self, group_ids: Sequence[str], now: float) -> list[GroupState]:
        found = [self._live(gid, now) for gid in group_ids]
        missing = [gid for gid, g in zip(group_ids, found) if g is None]
        if missing:
            raise UnknownGroups(missing, [g for g in missing if g in self._ended])
        return found  # type: ignore[return-value]

    # ---- data --------------------------------------------------------------------------

    def update(self, updates: Sequence[Update]) -> list[UpdateOutcome]:
        """Apply update_cst batches. Validated as a whole first: nothing is applied when any
        update is malformed, too large, or names an unknown group."""
        lim = self.limits
        if len(updates) > lim.max_updates_per_call:
            raise TooLarge(f"more than {lim.max_updates_per_call} updates in one call")
        for u in updates:
            _check_id("group_id", u.group_id, lim)
            _check_id("request_id", u.request_id, lim)
            if u.prev_token_count < 0:
                raise Malformed("prev_token_count must be >= 0")
            if len(u.tokens) > lim.max_tokens_per_update:
                raise TooLarge(f"more than {lim.max_tokens_per_update} tokens in one update")
            if any(t < 0 for t in u.tokens):
                raise Malformed("token ids must be >= 0")
        with self._lock:
            now = self.clock()
            groups = self._require([u.group_id for u in updates], now)
            out = []
            for g, u in zip(groups, updates):
                g.expires_at = now + g.ttl
                out.append(UpdateOutcome(*g.apply(u.request_id, u.prev_token_count, list(u.tokens), lim)))
            return out

    def sync(self, b: SyncBatch) -> SyncResult:
        """One packed message: its fetches (as ``fetch``, from before its own appends, which its
        sender has), then its appends (as ``update``). Groups that are not registered are answered
        in ``unknown`` (and ``ended``) instead of failing the call; everything else is checked
        before anything changes, so a malformed message applies nothing."""
        lim = self.limits
        n = len(b.request_ids)
        ng = len(b.group_ids)
        if not len(b.append_group) == len(b.append_prev) == len(b.append_len) == n:
            raise Malformed("request_ids, append_group, append_prev and append_len differ in length")
        if not len(b.fetch_group) == len(b.fetch_cursor) == len(b.fetch_known):
            raise Malformed("fetch_group, fetch_cursor and fetch_known differ in length")
        if n > lim.max_updates_per_call:
            raise TooLarge(f"more than {lim.max_updates_per_call} updates in one call")
        if 4 * sum(b.append_len) != len(b.tokens):
            raise Malformed("tokens do not hold sum(append_len) uint32 tokens")
        for kind, ids in (("group_id", b.group_ids), ("request_id", b.request_ids)):
            if ids and (not all(ids) or max(map(len, ids)) > lim.max_id_len):
                for i in ids:
                    _check_id(kind, i, lim)
        if n:
            if max(b.append_group) >= ng:
                raise Malformed("append_group out of range")
            if min(b.append_prev) < 0:
                raise Malformed("prev_token_count must be >= 0")
            if max(b.append_len) > lim.max_tokens_per_update:
                raise TooLarge(f"more than {lim.max_tokens_per_update} tokens in one update")
        if b.fetch_group and max(b.fetch_group) >= ng:
            raise Malformed("fetch_group out of range")
        budget = min(b.max_tokens if b.max_tokens > 0 else lim.max_fetch_tokens, lim.max_fetch_tokens)
        buf, max_group = b.tokens, lim.max_tokens_per_group
        with self._lock:
            now = self.clock()
            # (a group past its lease is served until the reaper frees it, within reap_interval_s)
            groups = list(map(self._groups.get, b.group_ids))
            cores = list(map(self._cores.get, b.group_ids))
            if None in groups:  # (and never a stale core for a group that is gone)
                cores = [None if g is None else g.tree.core for g in groups]
            fetched = list(map(cores.__getitem__, b.fetch_group))
            try:
                nxt, nseg, nnew, more, segs, toks = log_fetch(fetched, b.fetch_cursor, b.fetch_known, budget)
            except ValueError as e:
                raise Malformed(str(e)) from None
            res = SyncResult(bytearray(n), [0] * n, nxt, nseg, nnew, [], segs, toks, more)
            if any(nnew):
                for k in [k for k, m in enumerate(nnew) if m]:
                    names = groups[b.fetch_group[k]].request_ids
                    res.request_ids.extend(names[len(names) - nnew[k]:])
            status, committed = res.append_status, res.committed
            off = 0
            for k, (gi, rid, prev, m) in enumerate(zip(b.append_group, b.request_ids, b.append_prev, b.append_len)):
                g = groups[gi]
                if g is None:
                    status[k] = UpdateStatus.UNKNOWN_GROUP
                    off += m
                    continue
                g.expires_at = now + g.ttl
                idx = g.request_index.get(rid)
                if idx is not None and not g.pending:  # in order: one C call
                    length = g.tree.append_at(idx, prev, buf, off, m, max_group)
                    if length >= 0:
                        status[k], committed[k] = UpdateStatus.APPLIED, length
                        off += m
                        continue
                status[k], committed[k] = g.apply(rid, prev, unpack_u32(buf[4 * off : 4 * (off + m)]).tolist(), lim)
                off += m
            if None in groups:
                res.unknown = [i for i, g in enumerate(groups) if g is None]
                res.ended = [i for i in res.unknown if b.group_ids[i] in self._ended]
            return res

    def sync_raw(self, raw: bytes, cache: list | None = None) -> bytes | None:
        """``sync`` of a serialized SyncRequest, answered serialized, all in the compiled core (no
        Python step per group, append or token); None where ``sync`` must run instead: a message it
        would refuse (it raises the reason) or one the core's parser does not take, or no core.
        ``cache``: a connection's ``[None]``, where the core keeps the message's group lookup for
        the next one that names the same groups (while no group was added or dropped)."""
        if sync_packed is None:
            return None
        with self._lock:
            if cache is None:
                return sync_packed(raw, self._groups, self._fast, self._ended, self.clock(), self.limits)
            return sync_packed(raw, self._groups, self._fast, self._ended, self.clock(), self.limits, cache, self._epoch)

    def fetch(self, cursors: Sequence[tuple[str, int]], max_tokens: int = 0) -> list[GroupDelta]:
        """fetch_cst: for each (group, log offset) the segments the caller lacks."""
        budget = max_tokens if max_tokens > 0 else self.limits.max_fetch_tokens
        budget = min(budget, self.limits.max_fetch_tokens)
        for gid, start in cursors:
            _check_id("group_id", gid, self.limits)
            if start < 0:
                raise Malformed("cursor must be >= 0")
        with self._lock:
            groups = self._require([gid for gid, _ in cursors], self.clock())
            out = []
            for g, (_, start) in zip(groups, cursors):
                d = g.delta(start, budget)
                budget = max(1, budget - sum(len(s.tokens) for s in d.segments))
                out.append(d)
            return out

    def speculate(self, group_ids: Sequence[str], request_ids: Sequence[str], contexts: Sequence[Sequence[int]],
                  params: Sequence[DraftParams]) -> list[Draft]:
        """Server-side batch_speculate, for clients that keep no replica."""
        lim = self.limits
        if len(group_ids) > lim.max_rows_per_speculate:
            raise TooLarge(f"more than {lim.max_rows_per_speculate} rows")
        for gid, ctx, p in zip(group_ids, contexts, params):
            _check_id("group_id", gid, lim)
            if len(ctx) > lim.max_context_tokens:
                raise TooLarge(f"context longer than {lim.max_context_tokens} tokens")
            check_params(p, lim)
        with self._lock:
            groups = self._require(group_ids, self.clock())
            out = []
            for g, rid, ctx, p in zip(groups, request_ids, contexts, params):
                tail = list(ctx[-min(len(ctx), p.pattern_lookup_max):])
                paths, match_len = draft(g.tree, tail, p)
                out.append(Draft(rid, tuple(paths), match_len))
            return out

    # ---- introspection -----------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        with self._lock:
            groups = list(self._groups.values())
            return {
                "groups": len(groups),
                "requests": sum(len(g.request_ids) for g in groups),
                "tokens": sum(g.tree.num_tokens for g in groups),
                "nodes": sum(g.tree.num_nodes for g in groups if not g.tree.deferred),  # (unbuilt: none)
                "trees_built": sum(not g.tree.deferred for g in groups),
                "log_segments": sum(g.tree.log_size for g in groups),
                "expired_total": self.expired_total,
            }

    def sequence_length(self, group_id: str, request_id: str) -> int:
        """Tokens the server holds for one request of a live group (0 if none yet)."""
        with self._lock:
            g = self._require([group_id], self.clock())[0]
            idx = g.request_index.get(request_id)
            return 0 if idx is None else g.tree.seq_len(idx)

    def sequence_tokens(self, group_id: str, request_id: str) -> list[int]:
        """The tokens the server holds for one request of a live group (tests and tools)."""
        with self._lock:
            g = self._require([group_id], self.clock())[0]
            idx = g.request_index.get(request_id)
            return [] if idx is None else g.tree.seq_tokens(idx, 0, g.tree.seq_len(idx))

    def tree(self, group_id: str) -> SuffixTree:
        """The live tree of a group (tests and tools; do not mutate)."""
        with self._lock:
            return self._require([group_id], self.clock())[0].tree
