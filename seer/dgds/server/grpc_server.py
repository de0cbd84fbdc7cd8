"""The gRPC draft server: GroupStore behind the DraftServer service, plus grpc.health.v1.

The server is asyncio gRPC on a loop thread of its own (``DgdsServer`` keeps a blocking facade):
every handler runs on that one thread, so the store's lock is never contended and a long-lived
``SyncStream`` costs no thread while it waits (one per instance, however many instances).

Errors map to status codes (the server keeps serving after any of them): Malformed ->
INVALID_ARGUMENT, TooLarge -> RESOURCE_EXHAUSTED (also what gRPC itself returns for messages over
``max_message_bytes``), UnknownGroups -> NOT_FOUND with the ids in trailing metadata. With a
``token``, calls without ``authorization: Bearer <token>`` metadata get UNAUTHENTICATED (compared
in constant time); grpc.health.v1 answers without it, for liveness probes.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import threading
import time
from typing import Callable

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from seer.dgds.server.group_store import (DgdsError, GroupStore, Limits, Malformed, SyncBatch, TooLarge, UnknownGroups,
                                          Update)
from seer.dgds.server.lane import LaneProtocol
from seer.dgds.server.metrics import RpcMetrics
from seer.dgds.tree.suffix_tree import MAX_DEPTH
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.types import DraftParams
from seer.dgds.wire import AUTH_KEY, ENDED_GROUP_KEY, UNKNOWN_GROUP_KEY

log = logging.getLogger(__name__)

SERVICE_NAME = "seer.dgds.v1.DraftServer"
_HEALTH_PREFIX = "/grpc.health.v1.Health/"
MAX_GROUPS_PER_REGISTER = 4096


def _serialize(message) -> bytes:
    return message.SerializeToString()


def _serialize_any(message) -> bytes:
    """Sync answers come serialized already from the compiled core (GroupStore.sync_raw)."""
    return message if type(message) is bytes else message.SerializeToString()


def params_from_pb(p: pb.DraftParams) -> DraftParams:
    return DraftParams(p.max_spec_tokens, p.pattern_lookup_min, p.pattern_lookup_max, p.top_k, p.min_token_prob)


def params_to_pb(p: DraftParams) -> pb.DraftParams:
    return pb.DraftParams(
        max_spec_tokens=p.max_spec_tokens,
        pattern_lookup_min=p.pattern_lookup_min,
        pattern_lookup_max=p.pattern_lookup_max,
        top_k=p.top_k,
        min_token_prob=p.min_token_prob,
    )


def sync_batch(request: pb.SyncRequest) -> SyncBatch:
    """A SyncRequest unpacked for the store."""
    return SyncBatch(
        list(request.group_ids), list(request.request_ids), list(request.append_group), list(request.append_prev),
        list(request.append_len), request.tokens, list(request.fetch_group), list(request.fetch_cursor),
        list(request.fetch_known), request.max_tokens,
    )


def _status_of(e: DgdsError) -> tuple[grpc.StatusCode, list[tuple[str, str]]]:
    if isinstance(e, UnknownGroups):
        md = [(UNKNOWN_GROUP_KEY, g) for g in e.group_ids[:100]] + [(ENDED_GROUP_KEY, g) for g in e.ended[:100]]
        return grpc.StatusCode.NOT_FOUND, md
    if isinstance(e, Malformed):
        return grpc.StatusCode.INVALID_ARGUMENT, []
    if isinstance(e, TooLarge):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, []
    return grpc.StatusCode.INTERNAL, []  # pragma: no cover - every subclass is handled above


async def _abort(context: grpc.aio.ServicerContext, e: DgdsError):
    code, md = _status_of(e)
    if md:
        context.set_trailing_metadata(md)
    await context.abort(code, str(e))


_LARGE_ANSWERS = ("Sync", "FetchCst", "BatchSpeculate")  # answers that grow with what the store holds


def _size(answer) -> int:
    return len(answer) if type(answer) is bytes else answer.ByteSize()


def _rpc(request_type: type) -> Callable:
    """Parse the request (a malformed one is INVALID_ARGUMENT, not gRPC's UNKNOWN), time the call,
    count it, and turn DgdsErrors into status codes. The answer is counted in the memory budget
    until gRPC is done with the call (sent, or the call ended)."""

    def decorate(method: Callable) -> Callable:
        name = method.__name__

        @functools.wraps(method)
        async def wrapper(self: DraftServicer, raw: bytes, context: grpc.aio.ServicerContext):
            t0 = time.perf_counter()
            ok = False
            try:
                if name in _LARGE_ANSWERS:  # (registration, finish and metrics are answered whatever the budget)
                    self._room_for_answers()
                out = method(self, raw if request_type is bytes else _parse(request_type, raw))
                ok = True
                self._hold_answer(_size(out), context)
                return out
            except DgdsError as e:
                await _abort(context, e)
            finally:
                self.metrics.observe(name, time.perf_counter() - t0, ok)

        return wrapper

    return decorate


def _parse(request_type: type, raw: bytes):
    try:
        return request_type.FromString(raw)
    except DecodeError as e:
        raise Malformed(f"not a valid {request_type.__name__}: {e}") from None


class DraftServicer:
    """The DraftServer service of protos/dgds.proto. Requests arrive as bytes and are parsed here."""

    UNARY = ("RegisterGroup", "RegisterGroups", "FinishGroup", "UpdateCst", "FetchCst", "BatchSpeculate", "GetMetrics")

    def __init__(self, store: GroupStore, metrics: RpcMetrics):
        self.store = store
        self.metrics = metrics
        self.lane_port = 0  # the sync lane's, once bound (0: none)
        self.answer_bytes = 0  # answers made and not yet sent by gRPC (counted in the store's budget)

    def _charge_answer(self, n: int) -> None:
        self.answer_bytes += n
        self.store.charge_io(n)

    def _hold_answer(self, n: int, context: grpc.aio.ServicerContext) -> None:
        """Count a unary call's answer in the budget until the call is done."""
        self._charge_answer(n)
        context.add_done_callback(lambda _call: self._charge_answer(-n))

    def _room_for_answers(self) -> None:
        """Refuse to make another answer while answers not yet sent hold what the budget has left
        (an answer's size is known only once it is made: one may pass the budget)."""
        if self.answer_bytes and not self.store.has_room():
            raise TooLarge(f"the server's memory budget ({self.store.limits.max_bytes} bytes) is spent, "
                           f"{self.answer_bytes} bytes of it by answers not yet sent")

    def handler(self) -> grpc.GenericRpcHandler:
        """The service's method handlers, for grpc.aio.Server.add_generic_rpc_handlers."""
        methods = {}
        for name in self.UNARY:
            methods[name] = grpc.unary_unary_rpc_method_handler(getattr(self, name), response_serializer=_serialize)
        methods["Sync"] = grpc.unary_unary_rpc_method_handler(self.Sync, response_serializer=_serialize_any)
        methods["SyncStream"] = grpc.stream_stream_rpc_method_handler(self.SyncStream, response_serializer=_serialize_any)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)

    @_rpc(pb.RegisterGroupRequest)
    def RegisterGroup(self, request: pb.RegisterGroupRequest) -> pb.RegisterGroupResponse:
        depth = self.store.register(request.group_id, request.ttl_seconds, request.resume)
        return pb.RegisterGroupResponse(max_depth=depth, sync_lane_port=self.lane_port)

    @_rpc(pb.RegisterGroupsRequest)
    def RegisterGroups(self, request: pb.RegisterGroupsRequest) -> pb.RegisterGroupsResponse:
        if len(request.groups) > MAX_GROUPS_PER_REGISTER:
            raise TooLarge(f"more than {MAX_GROUPS_PER_REGISTER} groups in one RegisterGroups")
        status, errors = [], []
        for g in request.groups:
            try:
                self.store.register(g.group_id, g.ttl_seconds, g.resume)
                status.append(0)
                errors.append("")
            except DgdsError as e:
                status.append(_status_of(e)[0].value[0])
                errors.append(str(e))
        return pb.RegisterGroupsResponse(max_depth=self.store.max_depth, sync_lane_port=self.lane_port,
                                         status=status, error=errors)

    @_rpc(pb.FinishGroupRequest)
    def FinishGroup(self, request: pb.FinishGroupRequest) -> pb.FinishGroupResponse:
        self.store.finish(request.group_id)
        return pb.FinishGroupResponse()

    @_rpc(pb.UpdateCstRequest)
    def UpdateCst(self, request: pb.UpdateCstRequest) -> pb.UpdateCstResponse:
        updates = [Update(u.group_id, u.request_id, u.prev_token_count, u.new_tokens) for u in request.updates]
        outcomes = self.store.update(updates)
        return pb.UpdateCstResponse(
            results=[pb.UpdateResult(status=int(o.status), committed_token_count=o.committed_token_count) for o in outcomes]
        )

    @_rpc(pb.FetchCstRequest)
    def FetchCst(self, request: pb.FetchCstRequest) -> pb.FetchCstResponse:
        deltas = self.store.fetch([(c.group_id, c.log_offset) for c in request.caches], request.max_tokens)
        return pb.FetchCstResponse(
            groups=[
                pb.GroupIncrement(
                    group_id=d.group_id,
                    max_depth=d.max_depth,
                    start=d.start,
                    next=d.next,
                    segments=[pb.Segment(request_id=s.request_id, start=s.start, tokens=s.tokens) for s in d.segments],
                    more=d.more,
                )
                for d in deltas
            ]
        )

    def _sync(self, request: pb.SyncRequest) -> pb.SyncResponse:
        r = self.store.sync(sync_batch(request))
        return pb.SyncResponse(
            append_status=bytes(r.append_status), committed=r.committed, fetch_next=r.fetch_next,
            fetch_segments=r.fetch_segments, fetch_new_requests=r.fetch_new_requests, request_ids=r.request_ids,
            segments=r.segments, tokens=r.tokens, more=r.more, unknown_groups=r.unknown,
            ended_groups=r.ended,
        )

    def _sync_raw(self, raw: bytes, cache: list | None = None) -> bytes | pb.SyncResponse:
        """The compiled core's answer, or (for what it leaves to Python) GroupStore.sync's.
        ``cache``: the connection's (GroupStore.sync_raw)."""
        out = self.store.sync_raw(raw, cache)
        return out if out is not None else self._sync(_parse(pb.SyncRequest, bytes(raw)))

    @_rpc(bytes)
    def Sync(self, raw: bytes) -> bytes | pb.SyncResponse:
        return self._sync_raw(raw)

    async def SyncStream(self, requests, context: grpc.aio.ServicerContext):
        cache = [None]  # this stream's group lookup (GroupStore.sync_raw)
        async for raw in requests:
            t0 = time.perf_counter()
            try:
                self._room_for_answers()
                response = self._sync_raw(raw, cache)
            except DgdsError as e:
                self.metrics.observe("SyncStream", time.perf_counter() - t0, False)
                await _abort(context, e)
            self.metrics.observe("SyncStream", time.perf_counter() - t0, True)
            n = _size(response)
            self._charge_answer(n)  # counted until gRPC has it sent (its reader's flow control)
            try:
                await context.write(response)
            finally:
                self._charge_answer(-n)

    @_rpc(pb.BatchSpeculateRequest)
    def BatchSpeculate(self, request: pb.BatchSpeculateRequest) -> pb.BatchSpeculateResponse:
        rows = request.rows
        for r in rows:
            if not r.HasField("params"):
                raise Malformed("every row needs params")
        drafts = self.store.speculate(
            [r.group_id for r in rows],
            [r.request_id for r in rows],
            [r.context for r in rows],
            [params_from_pb(r.params) for r in rows],
        )
        return pb.BatchSpeculateResponse(
            drafts=[
                pb.RowDraft(
                    request_id=d.request_id,
                    match_len=d.match_len,
                    paths=[pb.DraftPath(tokens=p.tokens, probs=p.probs) for p in d.paths],
                )
                for d in drafts
            ]
        )

    @_rpc(pb.GetMetricsRequest)
    def GetMetrics(self, request: pb.GetMetricsRequest) -> pb.GetMetricsResponse:
        s = self.store.stats()
        return pb.GetMetricsResponse(
            groups=s["groups"],
            requests=s["requests"],
            tokens=s["tokens"],
            nodes=s["nodes"],
            approx_bytes=s["used_bytes"],  # the memory budget's accounting (Limits.max_bytes)
            expired_groups_total=s["expired_total"],
            uptime_s=time.monotonic() - self.metrics.started,
            rpcs=[
                pb.RpcMetrics(method=r.method, calls=r.calls, errors=r.errors, rate_per_s=r.rate_per_s,
                              p50_ms=r.p50_ms, p99_ms=r.p99_ms, total_p50_ms=r.total_p50_ms,
                              total_p99_ms=r.total_p99_ms, max_ms=r.max_ms)
                for r in self.metrics.summary()
            ],
        )


class _RequireToken(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for every call but health checks without ``authorization: Bearer <token>``."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(_HEALTH_PREFIX):
            return handler
        for key, value in details.invocation_metadata or ():
            if key == AUTH_KEY:
                got = value if isinstance(value, bytes) else value.encode()
                if hmac.compare_digest(got, self._expected):
                    return handler
                break

        async def refuse(request, context: grpc.aio.ServicerContext):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong DGDS token (SEER_DGDS_TOKEN)")

        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


class DgdsServer:
    """A running draft server: ``start()``, ``port``, ``stop(grace)``.

    ``token``: the run's secret; calls without it are refused (UNAUTHENTICATED), health checks
    excepted. None serves everyone who can reach ``host`` (tests, an engine's embedded server).
    A reaper task frees expired groups every ``reap_interval_s``; stop() first reports
    NOT_SERVING on the health service, then lets in-flight calls finish within ``grace``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_depth: int = MAX_DEPTH,
        limits: Limits = Limits(),
        max_message_bytes: int = 64 * 1024 * 1024,
        reap_interval_s: float = 1.0,
        token: str | None = None,
        lazy_trees: bool = True,
        sync_lane: bool = True,
    ):
        self.store = GroupStore(max_depth, limits, lazy_trees=lazy_trees)
        self._lane: asyncio.base_events.Server | None = None  # the sync lane (seer/dgds/server/lane.py)
        self._lane_conns: set = set()
        self.lane_port = 0
        self.metrics = RpcMetrics()
        self._reap_interval_s = reap_interval_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dgds-server", daemon=True)
        self._thread.start()
        self._stopped = False
        self._reaper: asyncio.Task | None = None
        try:
            self.port = self._run(self._bind(host, port, max_message_bytes, token, sync_lane))
        except BaseException:
            self._close_loop()
            raise
        if self.port == 0:
            self._close_loop()
            raise RuntimeError(f"cannot bind {host}:{port}")
        self.address = f"{host}:{self.port}"

    def _run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _bind(self, host: str, port: int, max_message_bytes: int, token: str | None, sync_lane: bool) -> int:
        self.health = health_aio.HealthServicer()
        self._server = grpc.aio.server(
            interceptors=[_RequireToken(token)] if token else None,
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.so_reuseport", 0),  # a second server on this port fails instead of sharing it
            ],
        )
        servicer = DraftServicer(self.store, self.metrics)
        self._server.add_generic_rpc_handlers((servicer.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        try:
            bound = self._server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:
            return 0
        if sync_lane and bound:  # on the same address, a port of its own
            store, limits = self.store, self.store.limits
            self._lane = await asyncio.get_running_loop().create_server(
                lambda: LaneProtocol(servicer._sync_raw, self.metrics.observe, _status_of, token, max_message_bytes,
                                     self._lane_conns, limits.max_lane_connections, store.reserve_io, store.release_io,
                                     max_unsent=limits.lane_unsent_bytes, charge=store.charge_io,
                                     has_room=store.has_room),
                host, 0)
            servicer.lane_port = self.lane_port = self._lane.sockets[0].getsockname()[1]
        return bound

    def start(self) -> DgdsServer:
        self._run(self._start())
        return self

    async def _start(self) -> None:
        await self._server.start()
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    async def _reap_loop(self) -> None:
        idle_s = self.store.limits.lane_idle_s
        while True:
            await asyncio.sleep(self._reap_interval_s)
            n = self.store.reap()
            if n:
                log.info("freed %d expired group(s)", n)
            now = time.monotonic()
            for conn in list(self._lane_conns):
                conn.account()  # answers sent since the last look are no longer charged
            for conn in [c for c in self._lane_conns if c.idle_for(now) >= idle_s]:
                log.info("closing a sync-lane connection idle for %.0f s in the middle of a frame", idle_s)
                conn.close()

    def stop(self, grace: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self._run(self._stop(grace), timeout=grace + 30)
        finally:
            self._close_loop()

    async def _stop(self, grace: float) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)
        if self._lane is not None:  # (after the gRPC calls' grace: a lane message is answered at once)
            self._lane.close()
            for conn in list(self._lane_conns):
                conn.close()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def wait(self) -> None:
        """Block until the server stops."""
        self._thread.join()
