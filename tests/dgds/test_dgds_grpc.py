"""The draft server over real gRPC on 127.0.0.1, and the client against it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seer.dgds.tree.suffix_tree import COMPILED
from seer.dgds.client.draft_client import DraftClient
from seer.dgds.server.group_store import Limits
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.proto import dgds_pb2_grpc as pb_grpc
from seer.dgds.server.grpc_server import SERVICE_NAME, UNKNOWN_GROUP_KEY, DgdsServer, DraftServicer
from seer.dgds.types import DraftParams, SpeculateRow

PARAMS = pb.DraftParams(max_spec_tokens=4, pattern_lookup_min=1, pattern_lookup_max=8, top_k=1, min_token_prob=0.0)


@pytest.fixture
def server():
    srv = DgdsServer(
        "127.0.0.1", 0, max_depth=16, reap_interval_s=0.05,
        limits=Limits(max_tokens_per_update=1000, max_rows_per_speculate=50), max_message_bytes=1 << 20,
    ).start()
    yield srv
    srv.stop(0.5)


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.address) as ch:
        yield pb_grpc.DraftServerStub(ch)


def code_of(call, *args) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call(*args, timeout=5)
    return e.value.code()


def still_serving(stub) -> None:
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="alive", ttl_seconds=30), timeout=5)
    r = stub.UpdateCst(pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="alive", request_id="r",
                                                                   prev_token_count=0, new_tokens=[1, 2, 1, 2])]), timeout=5)
    assert r.results[0].status == pb.APPLIED or r.results[0].status == pb.DUPLICATE


def test_health_serving(server):
    with grpc.insecure_channel(server.address) as ch:
        h = health_pb2_grpc.HealthStub(ch)
        for service in ("", SERVICE_NAME):
            resp = h.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_update_fetch_speculate_roundtrip(stub):
    assert stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=30), timeout=5).max_depth == 16
    ups = [pb.CstUpdate(group_id="g", request_id="a", prev_token_count=0, new_tokens=[1, 2, 3, 4, 5]),
           pb.CstUpdate(group_id="g", request_id="b", prev_token_count=2, new_tokens=[9]),   # ahead of a gap
           pb.CstUpdate(group_id="g", request_id="b", prev_token_count=0, new_tokens=[1, 2])]
    res = stub.UpdateCst(pb.UpdateCstRequest(updates=ups), timeout=5).results
    assert [r.status for r in res] == [pb.APPLIED, pb.BUFFERED, pb.APPLIED]
    assert res[2].committed_token_count == 3
    inc = stub.FetchCst(pb.FetchCstRequest(caches=[pb.CacheState(group_id="g", log_offset=0)]), timeout=5).groups[0]
    got = {(s.request_id, s.start, tuple(s.tokens)) for s in inc.segments}
    assert got == {("a", 0, (1, 2, 3, 4, 5)), ("b", 0, (1, 2)), ("b", 2, (9,))}
    again = stub.FetchCst(pb.FetchCstRequest(caches=[pb.CacheState(group_id="g", log_offset=inc.next)]), timeout=5)
    assert list(again.groups[0].segments) == [] and again.groups[0].next == inc.next
    d = stub.BatchSpeculate(pb.BatchSpeculateRequest(rows=[
        pb.SpeculateRow(request_id="b", group_id="g", context=[7, 1, 2], params=PARAMS)]), timeout=5).drafts[0]
    assert d.match_len == 2 and list(d.paths[0].tokens[:2]) == [3, 4]


def test_unknown_group_is_not_found(stub):
    for call, req in [
        (stub.UpdateCst, pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="ghost", request_id="r", new_tokens=[1])])),
        (stub.FetchCst, pb.FetchCstRequest(caches=[pb.CacheState(group_id="ghost")])),
        (stub.FinishGroup, pb.FinishGroupRequest(group_id="ghost")),
        (stub.BatchSpeculate, pb.BatchSpeculateRequest(rows=[pb.SpeculateRow(request_id="r", group_id="ghost",
                                                                             context=[1], params=PARAMS)])),
    ]:
        with pytest.raises(grpc.RpcError) as e:
            call(req, timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert (UNKNOWN_GROUP_KEY, "ghost") in tuple(e.value.trailing_metadata())
    still_serving(stub)


def test_malformed_and_oversized_requests_are_rejected_and_serving_continues(stub):
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=30), timeout=5)
    invalid = [
        (stub.RegisterGroup, pb.RegisterGroupRequest(group_id="", ttl_seconds=5)),
        (stub.RegisterGroup, pb.RegisterGroupRequest(group_id="g", ttl_seconds=-1)),
        (stub.UpdateCst, pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="g", request_id="r", prev_token_count=-3, new_tokens=[1])])),
        (stub.UpdateCst, pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="g", request_id="r", new_tokens=[1, -2])])),
        (stub.UpdateCst, pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="g", request_id="", new_tokens=[1])])),
        (stub.FetchCst, pb.FetchCstRequest(caches=[pb.CacheState(group_id="g", log_offset=999)])),
        (stub.BatchSpeculate, pb.BatchSpeculateRequest(rows=[pb.SpeculateRow(request_id="r", group_id="g", context=[1])])),
        (stub.BatchSpeculate, pb.BatchSpeculateRequest(rows=[pb.SpeculateRow(
            request_id="r", group_id="g", context=[1],
            params=pb.DraftParams(max_spec_tokens=4, pattern_lookup_min=5, pattern_lookup_max=2, top_k=1))])),
    ]
    for call, req in invalid:
        assert code_of(call, req) == grpc.StatusCode.INVALID_ARGUMENT, req
        still_serving(stub)
    oversized = [
        (stub.UpdateCst, pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="g", request_id="r", new_tokens=[1] * 1001)])),
        (stub.BatchSpeculate, pb.BatchSpeculateRequest(rows=[pb.SpeculateRow(request_id="r", group_id="g", context=[1],
                                                                             params=PARAMS)] * 51)),
        # over the server's 1 MiB message limit: gRPC itself refuses it
        (stub.UpdateCst, pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="g", request_id="r", new_tokens=[2**30] * 300_000)])),
    ]
    for call, req in oversized:
        assert code_of(call, req) == grpc.StatusCode.RESOURCE_EXHAUSTED
        still_serving(stub)
    # nothing of the failed calls was applied
    inc = stub.FetchCst(pb.FetchCstRequest(caches=[pb.CacheState(group_id="g")]), timeout=5).groups[0]
    assert list(inc.segments) == []


def test_expired_groups_are_freed(server, stub):
    # (a lease long enough for the calls below on a busy machine; shortened to 0.2 s at the end)
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="short", ttl_seconds=60), timeout=5)
    stub.UpdateCst(pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="short", request_id="r", new_tokens=list(range(50)))]), timeout=5)
    m = stub.GetMetrics(pb.GetMetricsRequest(), timeout=5)
    assert m.groups == 1 and m.tokens == 50 and m.approx_bytes > 0
    assert m.nodes == 0 or not COMPILED  # the tree: not built yet (lazy trees need the compiled core)
    # the first server-side draft builds the group's tree (from its log), which then holds nodes
    stub.BatchSpeculate(pb.BatchSpeculateRequest(rows=[pb.SpeculateRow(request_id="r", group_id="short", context=[1],
                                                                       params=PARAMS)]), timeout=5)
    assert stub.GetMetrics(pb.GetMetricsRequest(), timeout=5).nodes > 1
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="short", ttl_seconds=0.2), timeout=5)  # (renews to 0.2 s)
    deadline = time.monotonic() + 30
    while stub.GetMetrics(pb.GetMetricsRequest(), timeout=5).groups and time.monotonic() < deadline:
        time.sleep(0.05)
    m = stub.GetMetrics(pb.GetMetricsRequest(), timeout=5)
    assert (m.groups, m.tokens, m.nodes, m.expired_groups_total) == (0, 0, 0, 1)  # freed by the reaper
    assert code_of(stub.FetchCst, pb.FetchCstRequest(caches=[pb.CacheState(group_id="short")])) == grpc.StatusCode.NOT_FOUND
    rpcs = {r.method: r for r in m.rpcs}
    assert rpcs["UpdateCst"].calls == 1 and rpcs["GetMetrics"].calls >= 1 and rpcs["UpdateCst"].p50_ms > 0


def test_finish_group_frees_it(stub):
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=30), timeout=5)
    stub.FinishGroup(pb.FinishGroupRequest(group_id="g"), timeout=5)
    assert stub.GetMetrics(pb.GetMetricsRequest(), timeout=5).groups == 0


def test_clients_share_group_context_through_the_server(server):
    """Two instances hold different requests of one group; each drafts from the other's tokens."""
    a = DraftClient(server.address, update_batch_tokens=3, fetch_interval_s=0.02)
    b = DraftClient(server.address, update_batch_tokens=3, fetch_interval_s=0.02)
    try:
        a.register_group("g", 30)
        b.register_group("g", 30)
        sibling = [10, 11, 12, 13, 14, 15, 16, 17]
        for i in range(0, len(sibling), 2):  # token by token, as decoding produces them
            a.append("g", "r0", sibling[i : i + 2])
        b.append("g", "r1", [99, 10, 11])
        assert a.sync(5) and b.sync(5) and a.sync(5)
        row = SpeculateRow("r1", "g", [99, 10, 11], DraftParams(max_spec_tokens=4, pattern_lookup_max=4))
        [d] = b.batch_speculate([row])
        assert d.tokens == (12, 13, 14, 15) and d.match_len == 2
        # replicas on both instances equal the server's tree
        server_tree = server.store.tree("g").snapshot()
        assert a.replica("g").tree.snapshot() == server_tree == b.replica("g").tree.snapshot()
        assert a.stats().unacked_tokens == 0 and a.stats().rpc_errors == 0
        # a group the server lost (a restart: it never heard of it) is registered again and resent
        server.store.forget_all()
        a.append("g", "r0", [18])
        assert a.sync(5) or a.sync(5)
        assert server.store.tree("g").seqs[0] == sibling + [18]
        # finish_group frees it on the server, and the other instance drops it too
        a.finish_group("g")
        deadline = time.monotonic() + 5
        while (server.store.stats()["groups"] or b.has_replica("g")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.store.stats()["groups"] == 0
        assert not a.has_replica("g") and not b.has_replica("g")
    finally:
        a.close()
        b.close()


def test_client_without_server_returns_empty_drafts_and_never_raises():
    """A server that accepts no call (a listening socket nobody serves): the client's thread waits
    on it for rpc_timeout_s, while batch_speculate answers at once from local state (it would take
    the whole 60 s if it waited on the server); once the socket goes, calls fail and nothing raises."""
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)
    c = DraftClient(f"127.0.0.1:{hang.getsockname()[1]}", fetch_interval_s=0.01, rpc_timeout_s=60)
    try:
        c.register_group("g", 10)
        c.append("g", "r", [1, 2, 3, 1, 2, 3])
        time.sleep(0.2)  # (the thread is now in its RegisterGroups call)
        t0 = time.perf_counter()
        drafts = c.batch_speculate([SpeculateRow("r", "g", [1, 2], DraftParams())] * 256)
        assert time.perf_counter() - t0 < 20
        assert len(drafts) == 256 and all(d.paths == () for d in drafts)
        assert not c.sync(0.3) and c.stats().unacked_tokens == 6
        hang.close()  # (the connection is reset: the call fails)
        deadline = time.monotonic() + 30
        while c.stats().rpc_errors == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.stats().rpc_errors > 0 and c.stats().unacked_tokens == 6
    finally:
        hang.close()
        c.close(flush_timeout=0)


def test_cli_serves_health_and_shuts_down_gracefully():
    proc = subprocess.Popen([sys.executable, "-m", "seer.dgds.server.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--insecure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving on 127.0.0.1:" in line, line + proc.stderr.read()
        address = line.rsplit(" ", 1)[1].strip()
        with grpc.insecure_channel(address) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_client_accepts_numpy_tokens(server):
    np = pytest.importorskip("numpy")
    with DraftClient(server.address, update_batch_tokens=2, fetch_interval_s=0.02) as c:
        c.register_group("g", 30)
        c.append("g", "r", np.array([4, 5, 6, 4, 5, 6, 4], dtype=np.int64))
        assert c.sync(5)
        [d] = c.batch_speculate([SpeculateRow("r", "g", np.array([1, 4, 5]), DraftParams(max_spec_tokens=3))])
        assert d.tokens == (6, 4, 5) and all(type(t) is int for t in d.tokens)


def test_client_keeps_drafting_through_a_server_restart_and_resyncs():
    """The draft server dies mid-rollout and comes back on its port: the instance never sees an
    error, keeps drafting from its local replica meanwhile, and the new server gets every token
    within the bound of its start (SEER_RECORD=1: bench/results/failures/dgds_restart.json)."""
    from failure_record import bound, record

    resync = bound("dgds_restart", "resynced_after_server_back")

    srv = DgdsServer("127.0.0.1", 0).start()
    c = DraftClient(srv.address, update_batch_tokens=2, fetch_interval_s=0.02, rpc_timeout_s=0.3)
    new = None
    try:
        c.register_group("g", 30)
        c.append("g", "r0", [1, 2, 3, 4])
        assert c.sync(5)
        srv.stop(0)
        c.append("g", "r0", [5, 6])  # the server is gone: nothing raises
        assert not c.sync(0.5)
        row = SpeculateRow("r1", "g", [2, 3], DraftParams(max_spec_tokens=3, pattern_lookup_max=2))
        assert c.batch_speculate([row])[0].tokens == (4, 5, 6)  # local replica: drafts go on
        new = DgdsServer("127.0.0.1", srv.port).start()
        t_back = time.monotonic()
        deadline = t_back + resync.limit()
        while not c.sync(0.5) and time.monotonic() < deadline:
            pass
        resynced_s = time.monotonic() - t_back
        resync.check(resynced_s, what="the client did not resync with the restarted server")
        assert new.store.tree("g").seqs[0] == [1, 2, 3, 4, 5, 6]  # re-registered and resent
        record("dgds_restart", {"resynced_after_server_back_s": round(resynced_s, 2)},
               "DraftClient (0.3 s RPC timeout) against a DgdsServer stopped and started again on its port")
    finally:
        c.close()
        if new is not None:
            new.stop(0)


def test_fuzzed_raw_bytes_never_take_the_server_down(server):
    """Truncated, bit-flipped and random payloads on every method: each call gets an error status
    or a valid answer, and the server keeps answering health checks and real calls."""
    import random

    rng = random.Random(7)
    valid = {
        "RegisterGroup": pb.RegisterGroupRequest(group_id="fz", ttl_seconds=30),
        "UpdateCst": pb.UpdateCstRequest(updates=[pb.CstUpdate(group_id="fz", request_id="r", new_tokens=[1, 2, 3])]),
        "FetchCst": pb.FetchCstRequest(caches=[pb.CacheState(group_id="fz")]),
        "BatchSpeculate": pb.BatchSpeculateRequest(rows=[pb.SpeculateRow(request_id="r", group_id="fz", context=[1, 2],
                                                                          params=PARAMS)]),
        "FinishGroup": pb.FinishGroupRequest(group_id="zz"),
    }
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        stub = pb_grpc.DraftServerStub(ch)
        codes = set()
        for _ in range(400):
            method, msg = rng.choice(sorted(valid.items(), key=lambda kv: kv[0]))
            data = bytearray(msg.SerializeToString())
            kind = rng.randrange(3)
            if kind == 0 and data:
                data = data[: rng.randrange(len(data))]  # truncated
            elif kind == 1 and data:
                for _ in range(rng.randint(1, 4)):
                    data[rng.randrange(len(data))] = rng.randrange(256)  # corrupted
            else:
                data = bytearray(rng.randbytes(rng.randrange(1, 300)))  # garbage
            call = ch.unary_unary(f"/{SERVICE_NAME}/{method}", request_serializer=None, response_deserializer=None)
            try:
                call(bytes(data), timeout=5)
                codes.add("OK")
            except grpc.RpcError as e:
                codes.add(e.code().name)
                assert e.code() != grpc.StatusCode.UNKNOWN, e.details()  # every failure is a named one
        ok = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
        assert ok.status == health_pb2.HealthCheckResponse.SERVING
        still_serving(stub)
    assert "INVALID_ARGUMENT" in codes


def test_register_groups_gives_each_group_its_own_status(server, stub):
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="done", ttl_seconds=30), timeout=5)
    stub.FinishGroup(pb.FinishGroupRequest(group_id="done"), timeout=5)
    groups = [pb.RegisterGroupRequest(group_id="a", ttl_seconds=30), pb.RegisterGroupRequest(group_id="", ttl_seconds=30),
              pb.RegisterGroupRequest(group_id="done", ttl_seconds=30, resume=True),
              pb.RegisterGroupRequest(group_id="b", ttl_seconds=-1), pb.RegisterGroupRequest(group_id="c", ttl_seconds=30)]
    r = stub.RegisterGroups(pb.RegisterGroupsRequest(groups=groups), timeout=5)
    codes = [grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
             grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK]
    assert list(r.status) == [c.value[0] for c in codes] and r.max_depth == 16 and r.sync_lane_port == server.lane_port
    assert r.error[0] == "" and "non-empty" in r.error[1] and r.error[4] == ""
    assert server.store.stats()["groups"] == 2  # a and c
    too_many = pb.RegisterGroupsRequest(groups=[pb.RegisterGroupRequest(group_id=f"g{i}", ttl_seconds=30) for i in range(4097)])
    assert code_of(stub.RegisterGroups, too_many) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.store.stats()["groups"] == 2  # nothing of it applied


def _calls(server) -> dict[str, int]:
    with grpc.insecure_channel(server.address) as ch:
        return {r.method: r.calls for r in pb_grpc.DraftServerStub(ch).GetMetrics(pb.GetMetricsRequest(), timeout=5).rpcs}


def test_the_client_registers_its_groups_in_one_call_or_one_by_one_with_an_older_server(server, monkeypatch):
    c = DraftClient(server.address, fetch_interval_s=0.02)
    try:
        for k in range(50):
            c.register_group(f"g{k}", 30)
        assert c.sync(5) and c.stats().registered_groups == 50
        calls = _calls(server)
        assert calls.get("RegisterGroups") == 1 and "RegisterGroup" not in calls
    finally:
        c.close()
    # a server without RegisterGroups (UNIMPLEMENTED): the client falls back to RegisterGroup
    monkeypatch.setattr(DraftServicer, "UNARY", tuple(m for m in DraftServicer.UNARY if m != "RegisterGroups"))
    older = DgdsServer("127.0.0.1", 0, max_depth=16).start()
    c = DraftClient(older.address, fetch_interval_s=0.02)
    try:
        for k in range(5):
            c.register_group(f"h{k}", 30)
        assert c.sync(5) and c.stats().registered_groups == 5
        assert _calls(older).get("RegisterGroup") == 5
    finally:
        c.close()
        older.stop(0)
