"""The draft server's memory budget (Limits.max_bytes) against one authenticated client that tries
every way of making it hold more: many groups, many requests per group (empty appends included),
out-of-order batches, many tokens, and sync-lane connections parked in the middle of big frames.

Each attack runs against a real `seer-dgds serve` process with a small budget; the client must be
refused (RESOURCE_EXHAUSTED) and the process's RSS must stay within the budget (the server's own
accounting, which GetMetrics reports as approx_bytes, is an upper bound of what it holds). A Sync
that is refused applies nothing (checked here on the store behind the same code path).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from array import array

import grpc
import pytest

from seer.dgds.server.config import TOKEN_ENV
from seer.dgds.server.group_store import GroupStore, Limits, TooLarge, Update
from seer.dgds.server.grpc_server import DraftServicer
from seer.dgds.wire import HELLO, auth_metadata, frame
from seer.dgds.server.metrics import RpcMetrics
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.proto import dgds_pb2_grpc as pb_grpc

SECRET = "memory-test-secret"
BUDGET = 48 << 20
SLACK = 32 << 20  # allocator and gRPC buffers the accounting does not own
LANE_UNSENT = 4 << 20  # --lane-unsent-bytes
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MD = auth_metadata(SECRET)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Server:
    def __init__(self, *args: str):
        env = {**os.environ, TOKEN_ENV: SECRET}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seer.dgds.server.cli", "serve", "--host", "127.0.0.1", "--port", "0",
             "--max-bytes", str(BUDGET), "--reap-interval", "0.5", "--log-level", "WARNING", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line = self.proc.stdout.readline()
        assert "serving on 127.0.0.1:" in line, line
        self.address = line.rsplit(" ", 1)[1].strip()
        self.channel = grpc.insecure_channel(self.address, options=[("grpc.max_send_message_length", 64 << 20)])
        self.stub = pb_grpc.DraftServerStub(self.channel)
        self.base_rss = _rss(self.proc.pid)

    def metrics(self) -> pb.GetMetricsResponse:
        return self.stub.GetMetrics(pb.GetMetricsRequest(), timeout=30, metadata=MD)

    def check_within_budget(self) -> None:
        grown = _rss(self.proc.pid) - self.base_rss
        accounted = self.metrics().approx_bytes
        assert accounted <= BUDGET + (8 << 20)  # (one message's requests may pass it: docs/dgds.md)
        assert grown <= accounted + SLACK, (grown, accounted)
        assert grown <= BUDGET + SLACK, grown

    def close(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _sync(stub, groups, appends, tokens) -> grpc.StatusCode | None:
    """appends: (group index, request id, prev, length); None if it went through, else the code."""
    req = pb.SyncRequest(group_ids=groups, request_ids=[a[1] for a in appends], append_group=[a[0] for a in appends],
                         append_prev=[a[2] for a in appends], append_len=[a[3] for a in appends],
                         tokens=array("I", tokens).tobytes())
    try:
        stub.Sync(req, timeout=60, metadata=MD)
        return None
    except grpc.RpcError as e:
        return e.code()


def _register(stub, gids) -> list[int]:
    resp = stub.RegisterGroups(pb.RegisterGroupsRequest(
        groups=[pb.RegisterGroupRequest(group_id=g, ttl_seconds=600) for g in gids]), timeout=60, metadata=MD)
    return list(resp.status)


def _attack_groups(s: Server) -> None:
    for batch in range(100):
        status = _register(s.stub, [f"group-{batch}-{i}-" + "x" * 200 for i in range(1000)])
        if EXHAUSTED.value[0] in status:
            return
    raise AssertionError("100k groups registered within the budget")


def _attack_requests(s: Server) -> None:
    gids = [f"g{i}" for i in range(64)]
    assert _register(s.stub, gids) == [0] * 64
    # empty appends make no request
    assert _sync(s.stub, gids[:1], [(0, f"empty-{k}", 0, 0) for k in range(1000)], []) is None
    assert s.metrics().requests == 0
    for gi in range(64):
        for part in range(5):
            code = _sync(s.stub, gids, [(gi, f"r-{part}-{k}-" + "y" * 100, 0, 1) for k in range(1000)], [7] * 1000)
            if code is not None:
                assert code == EXHAUSTED
                if part < 4:  # not the per-group cap (4096): the budget
                    assert s.metrics().requests % 1000 == 0  # refused messages applied nothing
                    return
                break
        else:
            raise AssertionError("a group took 5000 requests (max_requests_per_group is 4096)")
    raise AssertionError("64 groups x 4000 requests within the budget")


def _attack_out_of_order(s: Server) -> None:
    gids = [f"g{i}" for i in range(256)]
    assert _register(s.stub, gids) == [0] * 256
    n = 16_384
    # 65 batches ahead of a gap for one request: past max_pending_per_request, refused whole
    assert _sync(s.stub, gids, [(0, "r", 1 + 2 * k, 1) for k in range(65)], [1] * 65) == EXHAUSTED
    for gi in range(256):
        for rid in range(8):
            code = _sync(s.stub, gids, [(gi, f"r{rid}", 1 + k * n, n) for k in range(8)], [5] * (8 * n))
            if code is not None:
                assert code == EXHAUSTED
                if rid * 8 * n + 8 * n <= Limits.max_pending_tokens_per_group:  # the budget, not the cap
                    return
                break
    raise AssertionError("256 groups' out-of-order batches within the budget")


def _attack_tokens(s: Server) -> None:
    gids = [f"g{i}" for i in range(4)]
    assert _register(s.stub, gids) == [0] * 4
    n = 65_536
    for step in range(200):
        code = _sync(s.stub, gids, [(gi, f"r{gi}", step * n, n) for gi in range(4)], list(range(n)) * 4)
        if code is not None:
            assert code == EXHAUSTED
            return
    raise AssertionError("52M tokens within the budget")


def _attack_lane(s: Server) -> None:
    resp = s.stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=600), timeout=30, metadata=MD)
    port = resp.sync_lane_port
    assert port

    def status(sock: socket.socket) -> int:
        head = b""
        while len(head) < 5:
            chunk = sock.recv(5 - len(head))
            if not chunk:
                return -1
            head += chunk
        return head[4]

    conns, refused_budget = [], 0
    for _ in range(16):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(frame(HELLO + SECRET.encode()))
        assert status(sock) == 0
        conns.append(sock)
    extra = socket.create_connection(("127.0.0.1", port), timeout=10)  # over --max-lane-connections
    extra.sendall(frame(HELLO + SECRET.encode()))
    assert status(extra) == EXHAUSTED.value[0]
    extra.close()
    parked = []
    for sock in conns:  # each parks half of an 8 MiB frame
        try:
            sock.sendall(struct.pack("<I", 8 << 20) + b"\0" * (4 << 20))
        except OSError:  # (refused and closed while sending)
            pass
    time.sleep(0.5)
    s.check_within_budget()
    for sock in conns:
        sock.settimeout(0.05)
        try:
            got = sock.recv(64)
        except socket.timeout:
            parked.append(sock)
            continue
        except ConnectionResetError:  # (closed with the frame's bytes unread)
            got = b""
        assert got[4] == EXHAUSTED.value[0] if len(got) > 4 else got == b""
        refused_budget += 1
    assert parked and refused_budget
    # stopped in the middle of a frame for --lane-idle seconds: closed, the budget given back
    deadline = time.monotonic() + 30
    for sock in parked:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        assert sock.recv(64) == b""  # (the server closed it)
    while s.metrics().approx_bytes > BUDGET // 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s.metrics().approx_bytes <= BUDGET // 4
    for sock in conns:
        sock.close()


def _read_frame(sock: socket.socket) -> tuple[int, bytes] | None:
    """(status byte, body) of one lane answer, or None at the end of the connection."""
    def exactly(n: int) -> bytes | None:
        out = bytearray()
        while len(out) < n:
            chunk = sock.recv(min(n - len(out), 1 << 20))
            if not chunk:
                return None
            out += chunk
        return bytes(out)

    head = exactly(5)
    if head is None:
        return None
    (n,) = struct.unpack_from("<I", head)
    body = exactly(n - 1)
    assert body is not None, "the connection ended in the middle of an answer"
    return head[4], body


FETCH_TOKENS = 100_000  # one fetch's answer: ~400 KB
PIPELINED = 300  # fetches in one write (4.8 KB): ~114 MiB of answers


def _attack_lane_answers(s: Server) -> None:
    """Many small fetches in one write, answers never read: the server stops answering (and reading)
    the connection at --lane-unsent-bytes of unsent answers, counts them in its budget, and every
    answer arrives once the client reads."""
    resp = s.stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=600), timeout=30, metadata=MD)
    half = FETCH_TOKENS // 2
    assert _sync(s.stub, ["g"], [(0, "r", 0, half), (0, "r", half, half)], list(range(FETCH_TOKENS))) is None
    time.sleep(1.2)  # (the reaper counts the appends anew: their upper-bound charges reach 1/16 of the budget)
    before = s.metrics().approx_bytes
    sock = socket.create_connection(("127.0.0.1", resp.sync_lane_port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # (the kernel's share stays small)
    sock.sendall(frame(HELLO + SECRET.encode()))
    assert _read_frame(sock) == (0, b"")
    fetch = frame(pb.SyncRequest(group_ids=["g"], fetch_group=[0], fetch_cursor=[0], fetch_known=[0])
                  .SerializeToString())
    sock.sendall(fetch * PIPELINED)
    time.sleep(1.5)  # (the server answers what it will, then waits)
    s.check_within_budget()
    held = s.metrics().approx_bytes - before  # the unsent answers, as the server counts them
    assert 0 < held <= LANE_UNSENT + (1 << 20), held  # the bound, plus the one answer that passed it
    answers = 0
    while (got := _read_frame(sock)) is not None:
        code, body = got
        assert code == 0, body.decode(errors="replace")
        assert len(pb.SyncResponse.FromString(body).tokens) == 4 * FETCH_TOKENS
        answers += 1
        if answers == PIPELINED:
            break
    assert answers == PIPELINED  # every fetch answered, in order, once the client read
    sock.close()
    deadline = time.monotonic() + 10
    # sent: no longer counted (what is left is the frames' own upper-bound charge, 16 per byte read)
    while s.metrics().approx_bytes - before > 16 * len(fetch) * PIPELINED and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s.metrics().approx_bytes - before <= 16 * len(fetch) * PIPELINED


def _attack_lane_answers_on_every_connection(s: Server) -> None:
    """16 connections each holding --lane-unsent-bytes would pass the budget: the server stays within
    it, and each client reads its answers and then, where the budget ran out, a RESOURCE_EXHAUSTED
    error (never an answer cut off, nothing after the error)."""
    resp = s.stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=600), timeout=30, metadata=MD)
    half = FETCH_TOKENS // 2
    assert _sync(s.stub, ["g"], [(0, "r", 0, half), (0, "r", half, half)], list(range(FETCH_TOKENS))) is None
    fetch = frame(pb.SyncRequest(group_ids=["g"], fetch_group=[0], fetch_cursor=[0], fetch_known=[0])
                  .SerializeToString())
    socks, per_conn = [], 60
    for _ in range(16):
        sock = socket.create_connection(("127.0.0.1", resp.sync_lane_port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.sendall(frame(HELLO + SECRET.encode()))
        assert _read_frame(sock) == (0, b"")
        sock.sendall(fetch * per_conn)
        socks.append(sock)
    time.sleep(1.5)
    s.check_within_budget()
    outcomes = []
    for sock in socks:
        answers, error = 0, None
        while answers < per_conn and (got := _read_frame(sock)) is not None:
            code, body = got
            if code != 0:
                error = (code, body.decode())
                assert _read_frame(sock) is None  # the error is the last frame
                break
            assert len(pb.SyncResponse.FromString(body).tokens) == 4 * FETCH_TOKENS
            answers += 1
        sock.close()
        outcomes.append((answers, error))
        assert answers == per_conn or (error is not None and error[0] == EXHAUSTED.value[0]
                                       and "memory budget" in error[1]), (answers, error)
    assert any(e is not None for _, e in outcomes) and any(a == per_conn for a, _ in outcomes), outcomes


def _attack_grpc_answers(s: Server) -> None:
    """The same fetches on a SyncStream whose client does not read: gRPC's flow control holds the
    server's writes, and the answer it holds is counted in the budget; reading gets every answer."""
    s.stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=600), timeout=30, metadata=MD)
    half = FETCH_TOKENS // 2
    assert _sync(s.stub, ["g"], [(0, "r", 0, half), (0, "r", half, half)], list(range(FETCH_TOKENS))) is None
    time.sleep(1.2)  # (the reaper's recount, as above)
    before = s.metrics().approx_bytes
    req = pb.SyncRequest(group_ids=["g"], fetch_group=[0], fetch_cursor=[0], fetch_known=[0])
    answers = s.stub.SyncStream(iter([req] * PIPELINED), metadata=MD, timeout=120)
    time.sleep(1.5)
    s.check_within_budget()
    held = s.metrics().approx_bytes - before
    assert 4 * FETCH_TOKENS <= held <= 2 * (4 * FETCH_TOKENS) + 16 * req.ByteSize() * PIPELINED, held
    assert sum(len(a.tokens) == 4 * FETCH_TOKENS for a in answers) == PIPELINED
    deadline = time.monotonic() + 10
    while s.metrics().approx_bytes - before > 16 * req.ByteSize() * PIPELINED and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s.metrics().approx_bytes - before <= 16 * req.ByteSize() * PIPELINED  # sent: no longer counted


ATTACKS = {"groups": _attack_groups, "requests": _attack_requests, "out_of_order": _attack_out_of_order,
           "tokens": _attack_tokens, "lane": _attack_lane, "lane_answers": _attack_lane_answers,
           "lane_answers_on_every_connection": _attack_lane_answers_on_every_connection,
           "grpc_answers": _attack_grpc_answers}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_one_client_cannot_grow_the_server_past_its_memory_budget(attack):
    s = Server("--max-lane-connections", "16", "--lane-idle", "4", "--lane-unsent-bytes", str(LANE_UNSENT))
    try:
        ATTACKS[attack](s)
        s.check_within_budget()
    finally:
        s.close()


def test_a_refused_sync_applies_nothing():
    """A message whose later append passes a limit leaves its earlier appends unapplied too
    (GroupStore.sync_raw, then GroupStore.sync as the server runs them)."""
    store = GroupStore(8, Limits(max_pending_per_request=4))
    store.register("g", 30)
    servicer = DraftServicer(store, RpcMetrics())
    req = pb.SyncRequest(group_ids=["g"], request_ids=["a"] + ["b"] * 5, append_group=[0] * 6,
                         append_prev=[0, 10, 20, 30, 40, 50], append_len=[3, 1, 1, 1, 1, 1],
                         tokens=array("I", [1, 2, 3, 4, 4, 4, 4, 4]).tobytes())
    with pytest.raises(TooLarge):
        servicer._sync_raw(req.SerializeToString(), [None])
    assert store.sequence_length("g", "a") == 0 and not store._groups["g"].pending
    del req.request_ids[-1], req.append_group[-1], req.append_prev[-1], req.append_len[-1]
    req.tokens = req.tokens[:-4]
    servicer._sync_raw(req.SerializeToString(), [None])  # four batches pending: within the limit
    assert store.sequence_length("g", "a") == 3 and len(store._groups["g"].pending[1]) == 4


def test_past_the_budget_idle_groups_are_evicted_least_recently_renewed_first():
    """Room is made from groups no append renewed for evict_idle_s, the longest idle first (they
    end: a client drops them); groups in use are never evicted, and what even evicting every idle
    group would not make room for is refused without evicting any."""
    now = [1000.0]
    store = GroupStore(8, Limits(max_bytes=1 << 20, evict_idle_s=60), clock=lambda: now[0])
    for i in range(4):
        store.register(f"g{i}", 600)
        store.update([Update(f"g{i}", "r", 0, list(range(5_000)))])
        now[0] += 100  # g0 is the longest idle, then g1, ...
    store.update([Update("g1", "r", 5_000, [1])])  # g1 in use again: renewed now
    used = store.used_bytes()
    # a group that needs a little more than is left: the longest idle group goes (g0), no other
    store.register("big", 600)
    store.update([Update("big", "r", 0, list(range(((1 << 20) - used) // 24 + 100)))])
    assert set(store._groups) == {"g1", "g2", "g3", "big"}
    assert store.evicted_total == 1 and "g0" in store._ended
    # more than evicting every idle group (g2, g3) would free: refused, and nothing evicted for it
    with pytest.raises(TooLarge):
        store.update([Update("big", "r2", 0, list(range(60_000)))])
    assert set(store._groups) == {"g1", "g2", "g3", "big"} and store.used_bytes() <= 1 << 20
