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
import logging
import os
import threading
from collections import OrderedDict
import time
from dataclasses import InitVar, dataclass, field
from typing import Callable, Sequence

from seer.dgds.tree.drafting import draft
from seer.dgds.tree.suffix_tree import MAX_DEPTH, SuffixTree, log_fetch, sync_packed
from seer.dgds.types import Draft, DraftParams, Segment
from seer.dgds.wire import unpack_u32

log = logging.getLogger(__name__)


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


def default_max_bytes() -> int:
    """The memory budget's default: a quarter of this machine's memory, at most 8 GiB (the server
    shares its node with inference instances or a trainer)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        ram = 16 << 30
    return min(8 << 30, ram // 4)


@dataclass(frozen=True)
class Limits:
    """Bounds that keep one misbehaving client from exhausting the server (docs/dgds.md, "Limits").

    ``max_bytes`` is the memory budget, in the store's own accounting (``GroupStore.used_bytes``):
    what would pass it is refused (RESOURCE_EXHAUSTED) once expired groups, groups idle for
    ``evict_idle_s`` (oldest first) and the records of ended groups are freed and it still would.
    """

    max_groups: int = 100_000
    max_tokens_per_update: int = 65_536
    max_updates_per_call: int = 4_096
    max_tokens_per_group: int = 16_000_000  # a group's tokens, buffered out-of-order ones included
    max_requests_per_group: int = 4_096
    max_pending_per_request: int = 64  # out-of-order batches waiting for a gap to fill
    max_pending_tokens_per_group: int = 1_048_576  # their tokens, over all of a group's requests
    max_bytes: int = field(default_factory=default_max_bytes)
    evict_idle_s: float = 60.0  # a group no append renewed for this long may be evicted for room
    max_lane_connections: int = 1_024
    lane_idle_s: float = 30.0  # a sync-lane connection stopped this long in the middle of a frame is closed
    # answers a sync-lane connection may have written but not yet sent (its client not reading): past
    # it the server answers no more of its frames and stops reading it until the answers drain
    lane_unsent_bytes: int = 4 << 20
    max_rows_per_speculate: int = 4_096
    max_context_tokens: int = 1_000_000
    max_spec_tokens: int = 256
    max_top_k: int = 16
    max_id_len: int = 256
    max_ttl_seconds: float = 7 * 24 * 3600.0
    max_fetch_tokens: int = 4_000_000

    def __post_init__(self) -> None:
        if self.max_pending_tokens_per_group < self.max_tokens_per_update:
            raise ValueError("max_pending_tokens_per_group must hold at least one update (max_tokens_per_update)")
        if self.max_pending_per_request < 1 or self.max_requests_per_group < 1 or self.max_bytes < 1 \
                or self.lane_unsent_bytes < 1:
            raise ValueError("max_pending_per_request, max_requests_per_group, max_bytes and lane_unsent_bytes "
                             "must be >= 1")


# The store's memory accounting (bytes; GroupStore.used_bytes). Upper bounds of what the compiled
# tree and the Python objects around it hold, array capacities (which double) included;
# tests/dgds/test_dgds_memory.py checks them against a real server's RSS.
GROUP_BYTES = 8_192  # GroupState, Tree, its first node and hash blocks, dicts and map entries
REQUEST_BYTES = 1_024  # a sequence: its Seq, list, id str and map entries (plus 8 * max_depth: its windows)
TOKEN_BYTES = 24  # a token in a sequence (int64) and in the log (uint32), both with doubling capacity
SEGMENT_BYTES = 64  # a log segment (4 int64, doubling)
BUILT_TOKEN_BYTES = 48  # a built tree's token also in its Python list (a pointer and an int object)
NODE_BYTES = 150  # a built tree's node (56-byte struct, doubling) and its hash entries
PENDING_BATCH_BYTES = 256  # an out-of-order batch: its tuple and dict entry
PENDING_TOKEN_BYTES = 48  # a token in it (a pointer and an int object)
ENDED_BYTES = 160  # the record of an ended group (plus its id)
# A Sync message taken by the compiled core is charged this much per byte before it runs (what its
# tokens and segments can add at most: 4 bytes per token, >= 10 per segment); the exact count
# replaces the charges at the next recount. A built tree's appends also add nodes and int objects.
RAW_BYTE_COST = 16
RAW_BYTE_COST_BUILT = 96
RECOUNT_MIN_S = 0.25  # a store at its budget counts anew at most this often (O(groups) each), else refuses


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
    pending_tokens: int = 0  # tokens in ``pending`` (they count toward max_tokens_per_group)
    id_bytes: int = 0  # the request ids' characters (nbytes stays O(1))
    charge: Callable[[int], None] | None = None  # the store's accounting (GroupStore._charge)

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

    def seq_of(self, request_id: str, limits: Limits | None = None) -> int:
        idx = self.request_index.get(request_id)
        if idx is None:
            if limits is not None and len(self.request_ids) >= limits.max_requests_per_group:
                raise TooLarge(f"group {self.group_id!r} holds the maximum of {limits.max_requests_per_group} requests")
            idx = self.tree.add_sequence()
            self.request_index[request_id] = idx
            self.request_ids.append(request_id)
            self.id_bytes += len(request_id)
            if self.charge is not None:
                self.charge(REQUEST_BYTES + 8 * self.tree.max_depth + len(request_id))
        return idx

    def apply(self, request_id: str, prev: int, tokens: Sequence[int], limits: Limits) -> tuple[UpdateStatus, int]:
        """(status, the request's contiguous tokens on the server now). An empty batch changes
        nothing (it makes no request). Callers check the limits first (GroupStore._check_appends,
        or sync_packed's pre-pass), so that a message is applied whole or not at all; the checks
        here are the backstop."""
        idx = self.request_index.get(request_id)
        if not tokens:
            return UpdateStatus.DUPLICATE, 0 if idx is None else self.tree.seq_len(idx)
        if idx is None:
            idx = self.seq_of(request_id, limits)
        seq_len = self.tree.seq_len  # (not tree.seqs: that would fill a lazy tree's Python lists)
        if prev > seq_len(idx):
            waiting = self.pending.setdefault(idx, {})
            old = waiting.get(prev)
            grow = len(tokens) - (0 if old is None else len(old))
            if old is None and len(waiting) >= limits.max_pending_per_request:
                raise TooLarge(f"request {request_id!r}: too many out-of-order batches pending")
            if self.pending_tokens + grow > limits.max_pending_tokens_per_group or \
                    self.tree.num_tokens + self.pending_tokens + grow > limits.max_tokens_per_group:
                raise TooLarge(f"group {self.group_id!r}: too many tokens buffered out of order")
            waiting[prev] = tuple(tokens)
            self.pending_tokens += grow
            if self.charge is not None:
                self.charge(grow * PENDING_TOKEN_BYTES + (PENDING_BATCH_BYTES if old is None else 0))
            return UpdateStatus.BUFFERED, seq_len(idx)
        status = self._append(idx, prev, tokens, limits)
        waiting = self.pending.get(idx)
        while waiting:
            ready = [p for p in waiting if p <= seq_len(idx)]
            if not ready:
                break
            p = min(ready)
            batch = waiting.pop(p)
            self.pending_tokens -= len(batch)
            if self.charge is not None:
                self.charge(-len(batch) * PENDING_TOKEN_BYTES - PENDING_BATCH_BYTES)
            self._append(idx, p, batch, limits)
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
        if self.tree.num_tokens + self.pending_tokens + len(new) > limits.max_tokens_per_group:
            raise TooLarge(f"group {self.group_id!r} would exceed {limits.max_tokens_per_group} tokens")
        self.tree.extend(idx, new)
        if self.charge is not None:
            self.charge(len(new) * (TOKEN_BYTES + (0 if self.tree.deferred else BUILT_TOKEN_BYTES)) + SEGMENT_BYTES)
        return UpdateStatus.APPLIED

    def nbytes(self) -> int:
        """This group's share of the store's accounting (GroupStore.used_bytes)."""
        t = self.tree
        n = GROUP_BYTES + len(self.group_id) + t.num_tokens * TOKEN_BYTES + t.log_size * SEGMENT_BYTES
        n += len(self.request_ids) * (REQUEST_BYTES + 8 * t.max_depth) + self.id_bytes
        if not t.deferred:
            n += t.num_tokens * BUILT_TOKEN_BYTES + t.num_nodes * NODE_BYTES
        if self.pending:
            n += self.pending_tokens * PENDING_TOKEN_BYTES + PENDING_BATCH_BYTES * sum(map(len, self.pending.values()))
        return n

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


def _check_appends(appends: Sequence[tuple[GroupState | None, str, int, int]], limits: Limits) -> int:
    """TooLarge if applying these (group, request, prev, length) appends in order would pass a
    limit of a group; else an upper bound of the bytes they add. Simulates GroupState.apply on the
    requests' lengths and out-of-order batches (a conflict is taken as new tokens: the bound may
    refuse what would fit, never the reverse), so that a message is applied whole or not at all."""
    lengths: dict[tuple[int, str], int] = {}
    waiting: dict[tuple[int, str], dict[int, int]] = {}
    groups: dict[int, list] = {}  # id(state) -> [tokens, pending tokens, requests, bytes per token]
    grow = 0
    for g, rid, prev, m in appends:
        if g is None or m == 0:
            continue
        key = (id(g), rid)
        gs = groups.get(id(g))
        if gs is None:
            gs = groups[id(g)] = [g.tree.num_tokens, g.pending_tokens, len(g.request_ids),
                                  TOKEN_BYTES + (0 if g.tree.deferred else BUILT_TOKEN_BYTES + 2 * NODE_BYTES)]
        length = lengths.get(key)
        if length is None:
            idx = g.request_index.get(rid)
            if idx is None:
                gs[2] += 1
                if gs[2] > limits.max_requests_per_group:
                    raise TooLarge(f"group {g.group_id!r} would pass {limits.max_requests_per_group} requests")
                grow += REQUEST_BYTES + 8 * g.tree.max_depth + len(rid)
                length = 0
                waiting[key] = {}
            else:
                length = g.tree.seq_len(idx)
                waiting[key] = {p: len(t) for p, t in g.pending.get(idx, {}).items()}
        w = waiting[key]
        if prev > length:
            old = w.get(prev)
            if old is None and len(w) >= limits.max_pending_per_request:
                raise TooLarge(f"request {rid!r}: too many out-of-order batches pending")
            gs[1] += m - (old or 0)
            w[prev] = m
            grow += m * PENDING_TOKEN_BYTES + PENDING_BATCH_BYTES
            if gs[1] > limits.max_pending_tokens_per_group:
                raise TooLarge(f"group {g.group_id!r}: too many tokens buffered out of order")
        else:
            new = max(0, prev + m - length)
            length += new
            gs[0] += new
            grow += new * gs[3] + SEGMENT_BYTES
            while w:
                ready = [p for p in w if p <= length]
                if not ready:
                    break
                p = min(ready)
                n = w.pop(p)
                gs[1] -= n
                new = max(0, p + n - length)
                length += new
                gs[0] += new
                grow += new * gs[3] + SEGMENT_BYTES
        lengths[key] = length
        if gs[0] + gs[1] > limits.max_tokens_per_group:
            raise TooLarge(f"group {g.group_id!r} would exceed {limits.max_tokens_per_group} tokens")
    return grow


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

    def __init__(self, max_depth: int = MAX_DEPTH, limits: Limits = Limits(), clock: Callable[[], float] = time.monotonic,
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
        # The memory accounting (used_bytes): exact as of the last recount, plus what changed since,
        # exactly where Python made the change, as an upper bound (RAW_BYTE_COST) for the compiled
        # core's appends.
        self._used = 0
        self._since_recount = 0  # bytes charged as upper bounds since the last recount
        self._recounted = clock()
        self._built = 0  # groups whose tree is built (their appends cost RAW_BYTE_COST_BUILT)
        self.io_bytes = 0  # buffered by the server's connections (the sync lane's partial frames)
        self.evicted_total = 0

    # ---- memory ------------------------------------------------------------------------

    def _charge(self, n: int) -> None:
        self._used += n

    def used_bytes(self) -> int:
        """The store's memory in its own accounting (an upper bound; Limits.max_bytes bounds it)."""
        return self._used + self.io_bytes

    def recount(self) -> int:
        """The accounting counted anew from every group (O(groups)); returns used_bytes()."""
        with self._lock:
            return self._recount_locked()

    def _recount_locked(self) -> int:
        self._used = sum(g.nbytes() for g in self._groups.values()) + \
            sum(ENDED_BYTES + len(gid) for gid in self._ended)
        self._built = sum(not g.tree.deferred for g in self._groups.values())
        self._since_recount = 0
        self._recounted = self.clock()
        return self._used + self.io_bytes

    def reserve_io(self, n: int) -> bool:
        """Room for n bytes a connection must buffer (a partial frame); False if over the budget."""
        with self._lock:
            if self._used + self.io_bytes + n > self.limits.max_bytes and not self._make_room(n, self.clock()):
                return False
            self.io_bytes += n
            return True

    def release_io(self, n: int) -> None:
        self.io_bytes -= n

    def charge_io(self, n: int) -> None:
        """Count n more (or, negative, fewer) bytes the connections hold that are already in memory
        (answers written but not yet sent): counted whatever the budget says, so that what comes
        next is refused while they are."""
        with self._lock:
            self.io_bytes += n

    def has_room(self) -> bool:
        """Whether the budget has room for anything at all (after making room as `reserve_io` does):
        checked before an answer is made, whose size is known only once it is."""
        return self.reserve_io(0)

    def _admit(self, n: int, now: float) -> None:
        """Room for n more bytes, or TooLarge (held lock)."""
        if self._used + self.io_bytes + n > self.limits.max_bytes and not self._make_room(n, now):
            raise TooLarge(f"the server's memory budget ({self.limits.max_bytes} bytes) is spent: "
                           f"{self._used + self.io_bytes} in use")

    def _make_room(self, n: int, now: float) -> bool:
        """Whether n more bytes fit after the accounting is counted anew and, if still needed, after
        expired groups, then groups idle for evict_idle_s (least recently renewed first), then the
        oldest records of ended groups are freed (held lock)."""
        budget = self.limits.max_bytes

        def fits() -> bool:
            return self._used + self.io_bytes + n <= budget

        if self._since_recount and now - self._recounted >= RECOUNT_MIN_S:  # (else it is exact, or was just counted)
            self._recount_locked()
        if fits():
            return True
        self._reap_locked(now)
        if fits():
            return True
        idle = sorted((g.expires_at - g.ttl, gid) for gid, g in self._groups.items()
                      if now - (g.expires_at - g.ttl) >= self.limits.evict_idle_s)
        ended = sum(ENDED_BYTES + len(gid) for gid in self._ended)
        if self._used + self.io_bytes + n - sum(self._groups[gid].nbytes() for _, gid in idle) - ended > budget:
            return False  # (evicting all of them would not make room: evict none)
        for _, gid in idle:
            if fits():
                break
            log.info("evicting idle group %r for room (memory budget)", gid)
            self._drop(gid)
            self.evicted_total += 1
        while not fits() and self._ended:
            gid, _ = self._ended.popitem(last=False)
            self._used -= ENDED_BYTES + len(gid)
        return fits()

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
                self._admit(GROUP_BYTES + len(group_id), now)
                g = GroupState(group_id, SuffixTree(self.max_depth, log=True, lazy=self.lazy_trees), ttl_seconds,
                               now + ttl_seconds, charge=self._charge)
                self._built += not g.tree.deferred
                self._used += g.nbytes()
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
            self._recount_locked()

    def _drop(self, group_id: str) -> None:
        """Forget a group that finished or expired (remembered as ended)."""
        g = self._groups.pop(group_id)
        self._used -= g.nbytes()
        self._built -= not g.tree.deferred
        g.charge = None
        self._cores.pop(group_id, None)
        self._fast.pop(group_id, None)
        self._epoch += 1
        if group_id not in self._ended:
            self._used += ENDED_BYTES + len(group_id)
        self._ended[group_id] = None
        self._ended.move_to_end(group_id)
        while len(self._ended) > self._max_ended:
            gid, _ = self._ended.popitem(last=False)
            self._used -= ENDED_BYTES + len(gid)

    def reap(self) -> int:
        """Free every expired group; returns how many. Also counts the memory accounting anew
        once what was charged as upper bounds since the last count reaches 1/16 of the budget (an
        O(groups) count, so not on a clock: the budget's own check counts anew when it must)."""
        with self._lock:
            now = self.clock()
            n = self._reap_locked(now)
            if self._since_recount * 16 > self.limits.max_bytes:
                self._recount_locked()
            return n

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
            self._admit(_check_appends([(g, u.request_id, u.prev_token_count, len(u.tokens))
                                        for g, u in zip(groups, updates)], lim), now)
            out = []
            for g, u in zip(groups, updates):
                g.expires_at = now + g.ttl
                out.append(UpdateOutcome(*g.apply(u.request_id, u.prev_token_count, list(u.tokens), lim)))
            return out

    def sync(self, b: SyncBatch, admitted: bool = False) -> SyncResult:
        """One packed message: its fetches (as ``fetch``, from before its own appends, which its
        sender has), then its appends (as ``update``). Groups that are not registered are answered
        in ``unknown`` (and ``ended``) instead of failing the call; everything else (the limits and
        the memory budget included) is checked before anything changes, so a message that fails
        applies nothing. ``admitted``: sync_raw charged its bytes already."""
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
            grow = _check_appends([(groups[gi], rid, prev, m) for gi, rid, prev, m in
                                   zip(b.append_group, b.request_ids, b.append_prev, b.append_len)], lim)
            if not admitted:
                self._admit(grow, now)
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
            now = self.clock()
            # charged up front, as an upper bound (what its tokens and segments can add; requests it
            # makes are charged as they are made, so the budget may be passed by one message's)
            charge = len(raw) * (RAW_BYTE_COST_BUILT if self._built else RAW_BYTE_COST)
            self._admit(charge, now)
            self._used += charge
            self._since_recount += charge
            if cache is None:
                return sync_packed(raw, self._groups, self._fast, self._ended, now, self.limits)
            return sync_packed(raw, self._groups, self._fast, self._ended, now, self.limits, cache, self._epoch)

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
                if g.tree.deferred:  # this draft builds the tree: room for it first
                    self._admit(g.tree.num_tokens * (BUILT_TOKEN_BYTES + 2 * NODE_BYTES), self.clock())
                    before = g.nbytes()
                    g.tree.core.materialize()
                    self._built += 1
                    self._used += g.nbytes() - before
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
                "evicted_total": self.evicted_total,
                "used_bytes": self._used + self.io_bytes,
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
