"""The draft client: a library inside each inference instance (a vLLM proposer calls it).

Decoding must never wait on the draft server, so the caller-facing methods only touch local state:

* ``register_group(group_id, ttl_seconds)`` and ``append(group_id, request_id, tokens)`` enqueue and
  return at once (O(1)); a background thread registers groups, applies the appended tokens to the
  local replica of each group, and every cycle sends one packed message on a long-lived stream
  (the server's sync lane, plain TCP, where it has one; else ``SyncStream``): the requests' unsent
  tokens in batches of ``update_batch_tokens`` per request, and, every ``fetch_interval_s``, the
  fetch of the increments (the other instances' tokens) of the groups it drafted from lately, in
  the same message.
* ``batch_speculate(rows)`` drafts for many requests at once from the local replicas: no RPC.

If the server is unreachable, groups stay unregistered (no replica) and speculation returns empty
drafts; the thread retries with backoff, and nothing raises into the caller. Tokens are kept until
the server acknowledges them, and a group the server lost (restart) is registered again and resent.
The run's secret comes from ``SEER_DGDS_TOKEN`` (or ``token=``) and travels in each call's metadata.

Typical use by a proposer::

    client = DraftClient("127.0.0.1:50061", update_batch_tokens=16)
    client.register_group("prompt-17", ttl_seconds=600)
    client.append("prompt-17", "req-17-3", new_token_ids)          # after every decode step
    drafts = client.batch_speculate([SpeculateRow("req-17-3", "prompt-17", context_ids,
                                                  DraftParams(max_spec_tokens=8))])
    drafts[0].tokens                                                # best path, maybe empty
    client.finish_request("prompt-17", "req-17-3")                  # flush its last tokens
    client.close()
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import grpc

from seer.dgds.client.lane import LaneClient, LaneError
from seer.dgds.client.replica import GroupReplica, ReplicaGap
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.proto import dgds_pb2_grpc as pb_grpc
from seer.dgds.tree.drafting import draft
from seer.dgds.types import Draft, SpeculateRow
from seer.dgds.wire import ENDED_GROUP_KEY, TOKEN_ENV, UNKNOWN_GROUP_KEY, auth_metadata, pack_u32, u32, unpack_u32

log = logging.getLogger(__name__)


def _ints(tokens: Sequence[int]) -> list[int]:
    """Plain ints from a list, tuple, numpy array or torch tensor (tensors do not hash by value)."""
    tolist = getattr(tokens, "tolist", None)
    return tolist() if tolist is not None else [int(t) for t in tokens]


@dataclass
class _OwnRequest:
    acked: int = 0  # tokens the server has committed
    finished: bool = False


@dataclass
class _Group:
    ttl: float
    touched: float  # last register/append by the caller (local lease)
    registered: bool = False
    resume: bool = False  # the server lost it: re-register only if it did not end there
    replica: GroupReplica | None = None
    unapplied: dict[str, list[int]] = field(default_factory=dict)  # own tokens awaiting a replica
    own: dict[str, _OwnRequest] = field(default_factory=dict)
    finish_on_server: bool = False
    drafted: float = -1e18  # last batch_speculate for one of its requests (monotonic seconds)


class _Stream:
    """One open SyncStream call: ``exchange`` sends a request and waits for its response; one that
    takes longer than ``timeout_s`` cancels the call (RpcError; the caller then opens a new one)."""

    _END = object()

    def __init__(self, stub: pb_grpc.DraftServerStub, metadata):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._call = stub.SyncStream(iter(self._requests.get, self._END), metadata=metadata)

    def exchange(self, request: pb.SyncRequest, timeout_s: float) -> pb.SyncResponse:
        self._requests.put(request)
        timer = threading.Timer(timeout_s, self._call.cancel)
        timer.daemon = True
        timer.start()
        try:
            return next(self._call)
        except StopIteration:  # the server ended the stream (it is shutting down)
            raise self._call from None
        finally:
            timer.cancel()

    def close(self) -> None:
        self._requests.put(self._END)
        self._call.cancel()


@dataclass(frozen=True)
class ClientStats:
    groups: int
    registered_groups: int
    update_calls: int
    fetch_calls: int
    tokens_sent: int
    tokens_fetched: int
    rpc_errors: int
    unacked_tokens: int


class DraftClient:
    """Local replicas of the server's group trees, kept current by one background thread."""

    def __init__(
        self,
        address: str,
        *,
        update_batch_tokens: int = 16,
        fetch_interval_s: float = 0.05,
        flush_interval_s: float = 0.5,
        rpc_timeout_s: float = 2.0,
        max_fetch_tokens: int = 1_000_000,
        max_message_bytes: int = 64 * 1024 * 1024,
        default_ttl_s: float = 600.0,
        token: str | None = None,
        fetch_idle_s: float = 2.0,
        quiet_interval_s: float = 0.25,
    ):
        """``update_batch_tokens``: a request's tokens are sent once this many are unsent (or after
        ``flush_interval_s``, or on finish_request/flush). ``fetch_interval_s``: period of the
        incremental fetch of the registered groups drafted from in the last ``fetch_idle_s``
        (``sync`` fetches every group in use: one with a request of this instance still running,
        or appended to or registered in the last ``fetch_idle_s``). A group nobody drafts from is
        not fetched: its replica is brought up to date from its cursor when a draft uses it again
        (that draft wakes the thread), so neither a rollout's finished groups nor the groups of a
        bulk phase that drafts nothing cost the engine's core their fetches.
        ``quiet_interval_s``: the thread's period while nothing was drafted here for
        ``fetch_idle_s`` (nothing to fetch; the tokens due go out in fewer, larger messages).
        ``token``: the server's secret (default: the ``SEER_DGDS_TOKEN`` environment variable;
        none if unset)."""
        if update_batch_tokens < 1:
            raise ValueError("update_batch_tokens must be >= 1")
        self.address = address
        self.update_batch_tokens = update_batch_tokens
        self.fetch_interval_s = fetch_interval_s
        self.fetch_idle_s = fetch_idle_s
        self.quiet_interval_s = max(fetch_interval_s, min(quiet_interval_s, flush_interval_s))
        self.flush_interval_s = flush_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.max_fetch_tokens = max_fetch_tokens
        self.default_ttl_s = default_ttl_s
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = pb_grpc.DraftServerStub(self._channel)
        self._token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._metadata = auth_metadata(self._token)
        self._stream: _Stream | None = None
        self._max_message_bytes = max_message_bytes
        self._lane_port = 0  # the server's sync lane (RegisterGroupResponse), 0: use the gRPC stream
        self._lane: LaneClient | None = None
        self._lane_unreachable = 0  # a lane port that could not be reached: not tried again
        self._batch_register = True  # RegisterGroups; False once a server answered UNIMPLEMENTED
        self._lock = threading.Lock()  # guards _groups and the replicas
        # (kind, group_id, request_id, tokens, ttl): deque appends are atomic, so callers never lock
        self._inbox: deque[tuple[str, str, str, list[int] | None, float]] = deque()
        self._groups: dict[str, _Group] = {}
        self._finishing: list[str] = []
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._synced = threading.Condition()
        self._sync_wanted = 0
        self._sync_done = 0
        self._last_fetch = 0.0
        self._last_flush = time.monotonic()
        self._last_draft = -1e18  # the last batch_speculate (monotonic)
        self._unsent = False  # tokens appended (or made due) since _sync last looked
        self._backoff = 0.0
        self._stats = dict(update_calls=0, fetch_calls=0, tokens_sent=0, tokens_fetched=0, rpc_errors=0)
        self._thread = threading.Thread(target=self._run, name="dgds-client", daemon=True)
        self._thread.start()

    # ---- caller-facing: all non-blocking --------------------------------------------------

    def register_group(self, group_id: str, ttl_seconds: float = 600.0) -> None:
        """Start following a group (idempotent). Its replica appears once the server answers.
        The group is forgotten locally ``ttl_seconds`` after the last register/append call."""
        if not group_id or not ttl_seconds > 0:
            raise ValueError("group_id must be non-empty and ttl_seconds > 0")
        self._inbox.append(("register", group_id, "", None, float(ttl_seconds)))
        self._wake.set()

    def append(self, group_id: str, request_id: str, tokens: Sequence[int]) -> None:
        """New tokens of one of this instance's requests (registers the group if needed).
        Returns at once; the tokens reach the local replica and the server in the background."""
        if tokens is None or len(tokens) == 0:
            return
        self._inbox.append(("append", group_id, request_id, _ints(tokens), 0.0))
        self._wake.set()

    def append_many(self, rows: Iterable[tuple[str, str, Sequence[int]]]) -> None:
        """``append`` for many (group_id, request_id, tokens) rows (one decode step of a batch).

        Does not wake the client's thread: an engine step calls this every step, and a thread
        cycle per step, on the engine's core, cost more than the tokens; they are applied and sent
        at its next ``fetch_interval_s`` tick (``sync``/``flush`` still force a cycle), or applied
        by the next ``batch_speculate``, which drafts from them."""
        for group_id, request_id, tokens in rows:
            if len(tokens):
                self._inbox.append(("append", group_id, request_id, _ints(tokens), 0.0))

    def finish_request(self, group_id: str, request_id: str) -> None:
        """The request is done: send its last tokens without waiting for a full batch."""
        self._inbox.append(("finish_request", group_id, request_id, None, 0.0))
        self._wake.set()

    def finish_group(self, group_id: str) -> None:
        """All of the group's requests are done everywhere: free it here and on the server."""
        self._inbox.append(("finish_group", group_id, "", None, 0.0))
        self._wake.set()

    def batch_speculate(self, rows: Sequence[SpeculateRow]) -> list[Draft]:
        """Drafts for many requests from the local replicas, one per row, same order.

        Each row carries its own DraftParams (max_spec_tokens, pattern_lookup_min/max, top_k,
        min_token_prob). A row whose group has no replica yet gets an empty Draft. Raises
        ValueError only for malformed params (a caller bug), never for server trouble.
        """
        out: list[Draft] = []
        self._drain_inbox()  # this instance's latest tokens first (appends since the thread's last tick)
        now = time.monotonic()
        stale = False  # a group not fetched lately: wake the thread to fetch it now
        with self._lock:
            for row in rows:
                problem = row.params.problem()
                if problem:
                    raise ValueError(f"row {row.request_id!r}: {problem}")
                g = self._groups.get(row.group_id)
                if g is not None:
                    stale = stale or now - g.drafted > self.fetch_idle_s
                    g.drafted = now
                if g is None or g.replica is None:
                    out.append(Draft(row.request_id))
                    continue
                ctx = row.context
                tail = _ints(ctx[len(ctx) - min(len(ctx), row.params.pattern_lookup_max):])
                paths, match_len = draft(g.replica.tree, tail, row.params)
                out.append(Draft(row.request_id, tuple(paths), match_len))
        self._last_draft = now
        if stale:
            self._wake.set()
        return out

    def sync(self, timeout: float = 5.0) -> bool:
        """Block until everything appended so far is acknowledged by the server and a fetch has
        completed after it (tests, benchmarks, shutdown). False on timeout."""
        with self._synced:
            self._sync_wanted += 1
            target = self._sync_wanted
        self._wake.set()
        with self._synced:
            return self._synced.wait_for(lambda: self._sync_done >= target or self._closed.is_set(), timeout)

    def has_replica(self, group_id: str) -> bool:
        with self._lock:
            g = self._groups.get(group_id)
            return g is not None and g.replica is not None

    def replica(self, group_id: str) -> GroupReplica | None:
        """The group's local replica (read-only use; tests and tools)."""
        with self._lock:
            g = self._groups.get(group_id)
            return None if g is None else g.replica

    def stats(self) -> ClientStats:
        with self._lock:
            unacked = 0
            for g in self._groups.values():
                unacked += sum(len(t) for t in g.unapplied.values())
                if g.replica is not None:
                    unacked += sum(g.replica.length(r) - o.acked for r, o in g.own.items())
            return ClientStats(len(self._groups), sum(g.registered for g in self._groups.values()),
                               unacked_tokens=unacked, **self._stats)

    def close(self, flush_timeout: float = 1.0) -> None:
        """Try to send what is unsent (bounded by flush_timeout), then stop the thread."""
        if not self._closed.is_set() and flush_timeout > 0:
            self.sync(flush_timeout)
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=5.0)
        if self._stream is not None:
            self._stream.close()
        if self._lane is not None:
            self._lane.close()
        self._channel.close()

    def __enter__(self) -> DraftClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- background thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed.is_set():
            timeout = self._backoff or (self.fetch_interval_s if time.monotonic() - self._last_draft <= self.fetch_idle_s
                                        else self.quiet_interval_s)
            self._wake.wait(timeout)
            self._wake.clear()
            if self._closed.is_set():
                break
            with self._synced:
                want = self._sync_wanted
            try:
                ok = self._cycle(force=want > self._sync_done)
            except Exception:  # never let the thread die: decoding relies on it quietly
                log.exception("dgds client cycle failed")
                ok = False
            if ok:
                self._backoff = 0.0
                if want > self._sync_done:
                    with self._synced:
                        self._sync_done = want
                        self._synced.notify_all()
            else:
                self._backoff = min(1.0, max(0.05, self._backoff * 2))
        with self._synced:
            self._synced.notify_all()

    def _cycle(self, force: bool) -> bool:
        """One round: local bookkeeping, registrations, updates, fetch. True if all RPCs worked."""
        self._drain_inbox()
        ok = self._register_pending()
        now = time.monotonic()
        flush = force or now - self._last_flush >= self.flush_interval_s
        fetch = force or now - self._last_fetch >= self.fetch_interval_s
        # A tick with no new tokens, no flush and nothing drafted from lately has nothing to send
        # or fetch: it skips the scan of every request (most ticks of a phase that drafts nothing).
        if force or flush or self._unsent or fetch and now - self._last_draft <= self.fetch_idle_s:
            self._unsent = False
            synced = self._sync(flush, fetch, every_group=force)
            self._unsent = self._unsent or not synced  # (what failed is tried again next tick)
            ok = synced and ok
        if flush:
            self._last_flush = now
        if fetch:
            self._last_fetch = now
        ok = self._finish_pending() and ok
        return ok

    def _drain_inbox(self) -> None:
        now = time.monotonic()
        with self._lock:
            while self._inbox:
                kind, gid, rid, tokens, ttl = self._inbox.popleft()
                g = self._groups.get(gid)
                if kind == "register":
                    if g is None:
                        self._groups[gid] = _Group(ttl=ttl, touched=now)
                    else:
                        g.ttl, g.touched = ttl, now
                elif kind == "append":
                    if g is None:
                        g = self._groups[gid] = _Group(ttl=self.default_ttl_s, touched=now)
                    g.touched = now
                    g.own.setdefault(rid, _OwnRequest())
                    if g.replica is None:
                        g.unapplied.setdefault(rid, []).extend(tokens or ())
                    else:
                        g.replica.append_local(rid, tokens or ())
                        self._unsent = True
                elif kind == "finish_request":
                    if g is not None:
                        g.own.setdefault(rid, _OwnRequest()).finished = True
                        self._unsent = True
                elif kind == "finish_group":
                    if self._groups.pop(gid, None) is not None:
                        self._finishing.append(gid)
            expired = [gid for gid, g in self._groups.items() if now - g.touched > g.ttl]
            for gid in expired:
                del self._groups[gid]

    def _call(self, method, request):
        try:
            return method(request, timeout=self.rpc_timeout_s, metadata=self._metadata), None
        except grpc.RpcError as e:
            self._stats["rpc_errors"] += 1
            return None, e

    def _exchange(self, request: pb.SyncRequest) -> pb.SyncResponse | None:
        """One message on the sync lane if the server has one, else on the gRPC stream (each opened
        when needed, dropped after any error). A lane that cannot be reached is not tried again
        until a registration names it anew (a restarted server): the stream carries the syncs."""
        if self._lane_port:
            try:
                if self._lane is None:
                    host = self.address.rsplit(":", 1)[0].strip("[]")
                    try:
                        self._lane = LaneClient(host, self._lane_port, self._token, self.rpc_timeout_s,
                                                self._max_message_bytes)
                    except LaneError as e:
                        if e.code() == grpc.StatusCode.UNAVAILABLE:
                            log.info("dgds sync lane %s:%d unreachable (%s): syncing over gRPC", host,
                                     self._lane_port, e.details())
                            self._lane_unreachable, self._lane_port = self._lane_port, 0
                        raise
                return pb.SyncResponse.FromString(self._lane.exchange(request.SerializeToString(), self.rpc_timeout_s))
            except LaneError as e:
                self._stats["rpc_errors"] += 1
                log.debug("sync failed on the lane: %s %s", e.code(), e.details())
                if self._lane is not None:
                    self._lane.close()
                self._lane = None
                return None
        try:
            if self._stream is None:
                self._stream = _Stream(self._stub, self._metadata)
            return self._stream.exchange(request, self.rpc_timeout_s)
        except grpc.RpcError as e:
            self._stats["rpc_errors"] += 1
            log.debug("sync failed: %s", e.code())
            self._stream.close()
            self._stream = None
            return None

    def _unknown_groups(self, err: grpc.RpcError) -> list[str]:
        if err.code() != grpc.StatusCode.NOT_FOUND:
            return []
        return [v for k, v in (err.trailing_metadata() or ()) if k == UNKNOWN_GROUP_KEY]

    def _lost(self, err: grpc.RpcError) -> list[str]:
        """Handle NOT_FOUND (the unknown groups are in the trailing metadata)."""
        ended = {v for k, v in (err.trailing_metadata() or ()) if k == ENDED_GROUP_KEY}
        return self._forget(self._unknown_groups(err), ended)

    def _forget(self, lost: Sequence[str], ended: set[str]) -> list[str]:
        """Groups finished or expired on the server are dropped here too; groups it does not know
        at all (a restart) are registered again and their tokens resent."""
        with self._lock:
            for gid in lost:
                if gid in ended:
                    self._groups.pop(gid, None)
                    continue
                g = self._groups.get(gid)
                if g is not None:
                    g.registered = False
                    g.resume = True
                    for own in g.own.values():
                        own.acked = 0
                    self._unsent = True
                    if g.replica is not None:
                        g.replica.reset_cursor()
        return list(lost)

    def _register_pending(self) -> bool:
        """Register what is not registered: in RegisterGroups calls of up to 1024 groups (one
        RegisterGroup per group with a server that lacks it)."""
        with self._lock:
            todo = [(gid, g.ttl, g.resume) for gid, g in self._groups.items() if not g.registered]
        ok = True
        while todo and self._batch_register:
            part, todo = todo[:1024], todo[1024:]
            req = pb.RegisterGroupsRequest(groups=[pb.RegisterGroupRequest(group_id=gid, ttl_seconds=ttl, resume=resume)
                                                   for gid, ttl, resume in part])
            resp, err = self._call(self._stub.RegisterGroups, req)
            if err is not None and err.code() == grpc.StatusCode.UNIMPLEMENTED:  # an older server
                self._batch_register = False
                todo = part + todo
                break
            if err is not None:
                log.debug("register of %d groups failed: %s", len(part), err.code())
                return False
            for (gid, _, _), status, why in zip(part, resp.status, resp.error):
                if status == grpc.StatusCode.NOT_FOUND.value[0]:  # a resume of a group that ended
                    self._forget([gid], {gid})
                elif status:
                    log.debug("register %s refused: %s", gid, why)
                    ok = False
                else:
                    self._registered(gid, resp)
        for gid, ttl, resume in todo:  # (what is left: only with a server that lacks RegisterGroups)
            req = pb.RegisterGroupRequest(group_id=gid, ttl_seconds=ttl, resume=resume)
            resp, err = self._call(self._stub.RegisterGroup, req)
            if err is not None:
                self._lost(err)
                log.debug("register %s failed: %s", gid, err.code())
                ok = False
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    break
                continue
            self._registered(gid, resp)
        return ok

    def _registered(self, gid: str, resp) -> None:
        """The server registered group gid (``resp``: its RegisterGroup(s)Response)."""
        with self._lock:
            g = self._groups.get(gid)
            if g is None:
                return
            g.registered = True
            g.resume = False
            if resp.sync_lane_port not in (self._lane_port, self._lane_unreachable):
                if self._lane is not None:
                    self._lane.close()
                self._lane, self._lane_port = None, resp.sync_lane_port
            if g.replica is None or g.replica.tree.max_depth != resp.max_depth:
                old = g.replica
                g.replica = GroupReplica(gid, resp.max_depth)
                if old is not None:  # depth changed: rebuild from what we had
                    for rid in old.request_index:
                        g.replica.append_local(rid, old.tokens(rid))
            for rid, toks in g.unapplied.items():
                g.replica.append_local(rid, toks)
            g.unapplied.clear()
            self._unsent = True

    def _sync(self, flush: bool, fetch: bool, every_group: bool = False) -> bool:
        """Send the unsent tokens that are due and, if ``fetch``, fetch the increments of the groups
        drafted from lately (``every_group``: of every group in use): one packed message (more only
        while the server cuts increments short by max_tokens)."""
        gids: dict[str, int] = {}  # group id -> index in the message
        rids: list[str] = []
        app_group, app_prev, app_len = [], [], []
        tokens = u32()
        fetches: list[tuple[str, GroupReplica]] = []
        now = time.monotonic()
        with self._lock:
            for gid, g in self._groups.items():
                if not g.registered or g.replica is None:
                    continue
                for rid, own in g.own.items():
                    unsent = g.replica.length(rid) - own.acked
                    if unsent > 0 and (flush or own.finished or unsent >= self.update_batch_tokens):
                        rids.append(rid)
                        app_group.append(gids.setdefault(gid, len(gids)))
                        app_prev.append(own.acked)
                        app_len.append(unsent)
                        tokens.extend(g.replica.tokens(rid, own.acked))
                if fetch and (now - g.drafted <= self.fetch_idle_s
                              or every_group and (now - g.touched <= self.fetch_idle_s
                                                  or any(not o.finished for o in g.own.values()))):
                    fetches.append((gid, g.replica))
        sent = list(zip(app_group, rids))
        ok = True
        while sent or fetches:
            for gid, _ in fetches:
                gids.setdefault(gid, len(gids))
            known = [len(r.server_names) for _, r in fetches]
            cursors = [r.cursor for _, r in fetches]
            request = pb.SyncRequest(
                group_ids=list(gids), request_ids=rids, append_group=app_group, append_prev=app_prev,
                append_len=app_len, tokens=pack_u32(tokens), fetch_group=[gids[gid] for gid, _ in fetches],
                fetch_cursor=cursors, fetch_known=known, max_tokens=self.max_fetch_tokens,
            )
            resp = self._exchange(request)
            if resp is None:
                return False
            names = list(gids)
            self._stats["update_calls"] += bool(sent)
            self._stats["fetch_calls"] += bool(fetches)
            if resp.unknown_groups:
                ok = False
                ended = {names[i] for i in resp.ended_groups}
                self._forget([names[i] for i in resp.unknown_groups], ended)
            with self._lock:
                self._acknowledge(names, sent, app_len, resp)
                again = self._apply_fetched(fetches, cursors, known, resp)
            sent, rids, app_group, app_prev, app_len, tokens = [], [], [], [], [], u32()
            gids, fetches = {}, again
        return ok

    def _acknowledge(self, names: list[str], sent: list[tuple[int, str]], lengths: list[int],
                     resp: pb.SyncResponse) -> None:
        for (gi, rid), n, status, committed in zip(sent, lengths, resp.append_status, resp.committed):
            gid = names[gi]
            g = self._groups.get(gid)
            if g is None or rid not in g.own or status == pb.UNKNOWN_GROUP:
                continue
            own = g.own[rid]
            if status == pb.CONFLICT:
                log.warning("server holds different tokens for %s/%s", gid, rid)
                own.acked = max(own.acked, committed)
                continue
            own.acked = max(own.acked, min(committed, g.replica.length(rid)))
            self._stats["tokens_sent"] += n

    def _apply_fetched(self, fetches: list[tuple[str, GroupReplica]], cursors: list[int], known: list[int],
                       resp: pb.SyncResponse) -> list[tuple[str, GroupReplica]]:
        """Apply each fetch's increment to its replica; the fetches to repeat (cut short)."""
        segments = unpack_u32(resp.segments).tolist()
        tokens = unpack_u32(resp.tokens).tolist()
        more = set(resp.more)
        again = []
        seg = tok = name = 0
        for k, ((gid, replica), start, n_known, nxt, n_seg, n_new) in enumerate(
                zip(fetches, cursors, known, resp.fetch_next, resp.fetch_segments, resp.fetch_new_requests)):
            segs = segments[3 * seg : 3 * (seg + n_seg)]
            n_tok = sum(segs[2::3])
            seg_tokens = tokens[tok : tok + n_tok]
            new_names = resp.request_ids[name : name + n_new]
            seg, tok, name = seg + n_seg, tok + n_tok, name + n_new
            g = self._groups.get(gid)
            if g is None or g.replica is not replica or not g.registered:
                continue  # finished, expired, lost or rebuilt meanwhile
            try:
                applied = replica.apply_packed(start, nxt, n_known, new_names, segs, seg_tokens)
            except ReplicaGap as e:  # should not happen; refetch from scratch
                log.warning("%s; refetching the group", e)
                replica.reset_cursor()
                continue
            if applied:
                self._stats["tokens_fetched"] += n_tok
                if k in more:
                    again.append((gid, replica))
        return again

    def _finish_pending(self) -> bool:
        with self._lock:
            todo, self._finishing = self._finishing, []
        for gid in todo:
            _, err = self._call(self._stub.FinishGroup, pb.FinishGroupRequest(group_id=gid))
            if err is not None and err.code() != grpc.StatusCode.NOT_FOUND:
                with self._lock:
                    self._finishing.append(gid)
                return False
        return True
