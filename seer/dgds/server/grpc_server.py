"""The gRPC draft server: GroupStore behind the DraftServer service, plus grpc.health.v1.

Errors map to status codes (the server keeps serving after any of them): Malformed ->
INVALID_ARGUMENT, TooLarge -> RESOURCE_EXHAUSTED (also what gRPC itself returns for messages over
``max_message_bytes``), UnknownGroups -> NOT_FOUND with the ids in trailing metadata.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent import futures
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seer.dgds.server.group_store import DgdsError, GroupStore, Limits, Malformed, TooLarge, UnknownGroups, Update
from seer.dgds.server.metrics import RpcMetrics
from seer.dgds.server.proto import dgds_pb2 as pb
from seer.dgds.server.proto import dgds_pb2_grpc as pb_grpc
from seer.dgds.types import DraftParams

log = logging.getLogger(__name__)

SERVICE_NAME = "seer.dgds.v1.DraftServer"
UNKNOWN_GROUP_KEY = "seer-dgds-unknown-group"
ENDED_GROUP_KEY = "seer-dgds-ended-group"  # subset of the unknown ones: finished or expired
# Rough memory per tree node and per stored token, sized for the pure-Python tree's objects; the
# compiled core's nodes are 56-byte structs, so for it the node share is an upper bound.
NODE_BYTES = 150
TOKEN_BYTES = 40


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


def _rpc(method: Callable) -> Callable:
    """Time the call, count it, and turn DgdsErrors into status codes."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: DraftServicer, request, context: grpc.ServicerContext):
        t0 = time.perf_counter()
        ok = False
        try:
            out = method(self, request, context)
            ok = True
            return out
        except UnknownGroups as e:
            context.set_trailing_metadata(
                [(UNKNOWN_GROUP_KEY, g) for g in e.group_ids[:100]] + [(ENDED_GROUP_KEY, g) for g in e.ended[:100]]
            )
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except Malformed as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except TooLarge as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except DgdsError as e:  # pragma: no cover - every subclass is handled above
            context.abort(grpc.StatusCode.INTERNAL, str(e))
        finally:
            self.metrics.observe(name, time.perf_counter() - t0, ok)

    return wrapper


class DraftServicer(pb_grpc.DraftServerServicer):
    def __init__(self, store: GroupStore, metrics: RpcMetrics):
        self.store = store
        self.metrics = metrics

    @_rpc
    def RegisterGroup(self, request: pb.RegisterGroupRequest, context) -> pb.RegisterGroupResponse:
        depth = self.store.register(request.group_id, request.ttl_seconds, request.resume)
        return pb.RegisterGroupResponse(max_depth=depth)

    @_rpc
    def FinishGroup(self, request: pb.FinishGroupRequest, context) -> pb.FinishGroupResponse:
        self.store.finish(request.group_id)
        return pb.FinishGroupResponse()

    @_rpc
    def UpdateCst(self, request: pb.UpdateCstRequest, context) -> pb.UpdateCstResponse:
        updates = [Update(u.group_id, u.request_id, u.prev_token_count, u.new_tokens) for u in request.updates]
        outcomes = self.store.update(updates)
        return pb.UpdateCstResponse(
            results=[pb.UpdateResult(status=int(o.status), committed_token_count=o.committed_token_count) for o in outcomes]
        )

    @_rpc
    def FetchCst(self, request: pb.FetchCstRequest, context) -> pb.FetchCstResponse:
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

    @_rpc
    def BatchSpeculate(self, request: pb.BatchSpeculateRequest, context) -> pb.BatchSpeculateResponse:
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

    @_rpc
    def GetMetrics(self, request: pb.GetMetricsRequest, context) -> pb.GetMetricsResponse:
        s = self.store.stats()
        return pb.GetMetricsResponse(
            groups=s["groups"],
            requests=s["requests"],
            tokens=s["tokens"],
            nodes=s["nodes"],
            approx_bytes=s["nodes"] * NODE_BYTES + s["tokens"] * TOKEN_BYTES,
            expired_groups_total=s["expired_total"],
            uptime_s=time.monotonic() - self.metrics.started,
            rpcs=[
                pb.RpcMetrics(method=r.method, calls=r.calls, errors=r.errors, rate_per_s=r.rate_per_s,
                              p50_ms=r.p50_ms, p99_ms=r.p99_ms)
                for r in self.metrics.summary()
            ],
        )


class DgdsServer:
    """A running draft server: ``start()``, ``port``, ``stop(grace)``.

    A reaper thread frees expired groups every ``reap_interval_s``; stop() first reports
    NOT_SERVING on the health service, then lets in-flight calls finish within ``grace``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_depth: int = 64,
        limits: Limits = Limits(),
        max_workers: int = 8,
        max_message_bytes: int = 64 * 1024 * 1024,
        reap_interval_s: float = 1.0,
    ):
        self.store = GroupStore(max_depth, limits)
        self.metrics = RpcMetrics()
        self.health = health.HealthServicer()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dgds"),
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
            ],
        )
        pb_grpc.add_DraftServerServicer_to_server(DraftServicer(self.store, self.metrics), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise RuntimeError(f"cannot bind {host}:{port}")
        self.address = f"{host}:{self.port}"
        self._reap_interval_s = reap_interval_s
        self._stopping = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="dgds-reaper", daemon=True)

    def start(self) -> DgdsServer:
        self._server.start()
        for service in ("", SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._reaper.start()
        return self

    def _reap_loop(self) -> None:
        while not self._stopping.wait(self._reap_interval_s):
            n = self.store.reap()
            if n:
                log.info("freed %d expired group(s)", n)

    def stop(self, grace: float = 5.0) -> None:
        self._stopping.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()

    def wait(self) -> None:
        self._server.wait_for_termination()
