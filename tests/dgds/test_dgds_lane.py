"""The sync lane (Sync messages over plain TCP beside the gRPC server): the secret first, bad frames
refused without harm to others, the same answers as the gRPC stream, and DraftClient on it with
the gRPC stream as its fallback (no vLLM)."""

from __future__ import annotations

import random
import socket
import time
from array import array

import grpc
import pytest

from seer.dgds.client import lane as client_lane
from seer.dgds.server import lane
from seer.dgds.client.draft_client import DraftClient
from seer.dgds.server.grpc_server import DgdsServer
from seer.dgds.wire import auth_metadata
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.proto import dgds_pb2_grpc as pb_grpc

SECRET = "lane-secret-for-this-test"


@pytest.fixture
def server():
    srv = DgdsServer("127.0.0.1", 0, max_depth=8, token=SECRET, max_message_bytes=1 << 20).start()
    yield srv
    srv.stop(0)


def _connect(srv: DgdsServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.lane_port), timeout=5)
    return s


def _read_frame(s: socket.socket) -> bytes | None:
    """A server frame's status and payload; None once the server closed the connection."""
    head = b""
    while len(head) < 4:
        try:
            chunk = s.recv(4 - len(head))
        except ConnectionResetError:  # (closed while we were still sending: a reset)
            return None
        if not chunk:
            return None
        head += chunk
    n = int.from_bytes(head, "little")
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "closed inside a frame"
        data += chunk
    return data


def _status(data: bytes) -> grpc.StatusCode:
    return client_lane._CODES[data[0]]


def _register(srv: DgdsServer, *gids: str) -> pb.RegisterGroupResponse:
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.DraftServerStub(ch)
        for g in gids:
            r = stub.RegisterGroup(pb.RegisterGroupRequest(group_id=g, ttl_seconds=60), timeout=5,
                                   metadata=auth_metadata(SECRET))
    return r


def _authed(srv: DgdsServer) -> socket.socket:
    s = _connect(srv)
    s.sendall(lane.frame(lane.HELLO + SECRET.encode()))
    assert _read_frame(s) == b"\x00"
    return s


def test_the_lane_listens_on_the_servers_host_only_and_is_named_by_registration(server):
    assert server._lane.sockets[0].getsockname()[0] == "127.0.0.1"
    assert _register(server, "g").sync_lane_port == server.lane_port > 0
    off = DgdsServer("127.0.0.1", 0, sync_lane=False).start()
    try:
        assert off.lane_port == 0 and _register(off, "g").sync_lane_port == 0
    finally:
        off.stop(0)


@pytest.mark.parametrize("hello", [b"", lane.HELLO, lane.HELLO + b"wrong", SECRET.encode(), b"x" * 5000],
                         ids=["empty", "no-secret", "wrong-secret", "no-prefix", "oversized"])
def test_a_connection_without_the_secret_is_refused_and_closed(server, hello):
    _register(server, "g")
    s = _connect(server)
    # (an oversized frame's header alone: bytes the server never reads would reset the connection)
    s.sendall(lane.frame(hello) if len(hello) <= lane.MAX_HELLO_BYTES else len(hello).to_bytes(4, "little"))
    data = _read_frame(s)
    want = grpc.StatusCode.RESOURCE_EXHAUSTED if len(hello) > lane.MAX_HELLO_BYTES else grpc.StatusCode.UNAUTHENTICATED
    assert _status(data) == want
    assert _read_frame(s) is None  # closed
    # and a Sync sent without a hello is not answered either
    s = _connect(server)
    s.sendall(lane.frame(pb.SyncRequest(group_ids=["g"], fetch_group=[0], fetch_cursor=[0], fetch_known=[0]).SerializeToString()))
    assert _status(_read_frame(s)) == grpc.StatusCode.UNAUTHENTICATED and _read_frame(s) is None


def test_a_silent_connection_is_closed(server, monkeypatch):
    monkeypatch.setattr(lane, "HELLO_TIMEOUT_S", 0.3)
    s = _connect(server)
    t0 = time.monotonic()
    assert _status(_read_frame(s)) == grpc.StatusCode.UNAUTHENTICATED and _read_frame(s) is None
    assert time.monotonic() - t0 < 5


def test_bad_frames_close_their_connection_only(server):
    _register(server, "g")
    good = _authed(server)
    for bad, code in [(lane.frame(b"\xff\xff\xff"), grpc.StatusCode.INVALID_ARGUMENT),  # not a SyncRequest
                      (((1 << 20) + 1).to_bytes(4, "little"), grpc.StatusCode.RESOURCE_EXHAUSTED)]:  # over the limit
        s = _authed(server)
        s.sendall(bad)
        assert _status(_read_frame(s)) == code and _read_frame(s) is None
    # the other connection and the gRPC side still serve
    good.sendall(lane.frame(pb.SyncRequest(group_ids=["g"], request_ids=["r"], append_group=[0], append_prev=[0],
                                           append_len=[2], tokens=array("I", [3, 4]).tobytes()).SerializeToString()))
    data = _read_frame(good)
    assert data[0] == 0 and list(pb.SyncResponse.FromString(data[1:]).committed) == [2]
    assert _register(server, "h").max_depth == 8


def test_the_lane_answers_as_the_grpc_stream(server):
    """The same random messages (appends in and out of order, unknown groups, fetches) to two
    servers, one over the lane and one over SyncStream: the same answers, byte for byte."""
    other = DgdsServer("127.0.0.1", 0, max_depth=8, token=SECRET).start()
    try:
        gids = [f"g{i}" for i in range(4)]
        for srv in (server, other):
            _register(srv, *gids[:3])
        rng = random.Random(3)
        msgs, lens = [], {}
        for _ in range(60):
            names = rng.sample(gids, rng.randint(1, 4))
            req = pb.SyncRequest(group_ids=names)
            toks = []
            for _ in range(rng.randint(0, 4)):
                gi, rid = rng.randrange(len(names)), f"r{rng.randrange(2)}"
                prev = lens.get((names[gi], rid), 0) + rng.choice([0, 0, 0, 2])
                m = rng.choice([1, 3, 8])
                req.request_ids.append(rid)
                req.append_group.append(gi)
                req.append_prev.append(prev)
                req.append_len.append(m)
                toks += [rng.randrange(4) for _ in range(m)]
                lens[(names[gi], rid)] = max(lens.get((names[gi], rid), 0), prev + m)
            req.tokens = array("I", toks).tobytes()
            for gi in range(len(names)):
                req.fetch_group.append(gi)
                req.fetch_cursor.append(0)
                req.fetch_known.append(0)
            msgs.append(req)
        s = _authed(server)
        via_lane = []
        for req in msgs:
            s.sendall(lane.frame(req.SerializeToString()))
            data = _read_frame(s)
            assert data[0] == 0
            via_lane.append(data[1:])
        with grpc.insecure_channel(other.address) as ch:
            stream = pb_grpc.DraftServerStub(ch).SyncStream(iter(msgs), timeout=10, metadata=auth_metadata(SECRET))
            via_grpc = [r.SerializeToString() for r in stream]
        assert via_lane == via_grpc
    finally:
        other.stop(0)


def _lane_calls(srv: DgdsServer) -> dict[str, int]:
    with grpc.insecure_channel(srv.address) as ch:
        m = pb_grpc.DraftServerStub(ch).GetMetrics(pb.GetMetricsRequest(), timeout=5, metadata=auth_metadata(SECRET))
    return {r.method: r.calls for r in m.rpcs}


def test_the_client_syncs_over_the_lane_and_falls_back_to_grpc_when_it_goes(server):
    a = DraftClient(server.address, update_batch_tokens=1, fetch_interval_s=0.02, token=SECRET)
    b = DraftClient(server.address, update_batch_tokens=1, fetch_interval_s=0.02, token=SECRET)
    try:
        for c in (a, b):
            c.register_group("g")
        a.append("g", "ra", [1, 2, 3])
        assert a.sync(5) and b.sync(5) and b.sync(5)
        assert b.replica("g").tree.seqs == [[1, 2, 3]]
        calls = _lane_calls(server)
        assert calls.get("SyncLane", 0) > 0 and calls.get("SyncStream", 0) == 0
        # the lane goes away (its listener and connections): the clients carry on over the gRPC stream
        server._run(_close_lane(server))
        a.append("g", "ra", [4, 5])
        deadline = time.monotonic() + 10
        while b.replica("g").tree.seqs != [[1, 2, 3, 4, 5]] and time.monotonic() < deadline:
            b.sync(1)
        assert b.replica("g").tree.seqs == [[1, 2, 3, 4, 5]]
        assert _lane_calls(server).get("SyncStream", 0) > 0
    finally:
        a.close()
        b.close()


async def _close_lane(srv: DgdsServer) -> None:
    srv._lane.close()
    await srv._lane.wait_closed() if not srv._lane_conns else None
    for t in list(srv._lane_conns):
        t.close()


def test_random_and_corrupted_frames_get_a_status_never_a_crash(server):
    """Truncated, bit-flipped and random SyncRequests on the lane: each is answered OK or with a
    status naming the fault (as on gRPC), and the server keeps serving."""
    _register(server, "g")
    rng = random.Random(5)
    valid = pb.SyncRequest(group_ids=["g"], request_ids=["r"], append_group=[0], append_prev=[0], append_len=[3],
                           tokens=array("I", [1, 2, 3]).tobytes(), fetch_group=[0], fetch_cursor=[0],
                           fetch_known=[0]).SerializeToString()
    allowed = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
               grpc.StatusCode.NOT_FOUND}
    seen = set()
    s = _authed(server)
    for k in range(300):
        kind = k % 3
        if kind == 0:
            payload = valid[: rng.randrange(len(valid))]
        elif kind == 1:
            b = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            payload = bytes(b)
        else:
            payload = rng.randbytes(rng.randint(0, 64))
        s.sendall(lane.frame(payload))
        data = _read_frame(s)
        assert data is not None
        code = _status(data)
        assert code in allowed, (payload, data)
        seen.add(code)
        if code != grpc.StatusCode.OK:  # the server closed this connection: a new one
            assert _read_frame(s) is None
            s = _authed(server)
    assert grpc.StatusCode.OK in seen and grpc.StatusCode.INVALID_ARGUMENT in seen
    assert _register(server, "h").max_depth == 8
