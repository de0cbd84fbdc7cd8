"""The packed Sync message (what DraftClient sends): appends and fetches of many groups at once, the
same answers as UpdateCst/FetchCst, and the compiled log equal to the pure-Python reference."""

from __future__ import annotations

import random
from array import array

import grpc
import pytest

from seer.dgds.server.group_store import GroupStore, Limits, TooLarge
from seer.dgds.server.grpc_server import DgdsServer, DraftServicer
from seer.dgds.server.metrics import RpcMetrics
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.proto import dgds_pb2_grpc as pb_grpc
from seer.dgds.tree import suffix_tree
from seer.dgds.tree.suffix_tree import SuffixTree


def u32(values) -> bytes:
    return array("I", values).tobytes()


def unpack(data: bytes) -> list[int]:
    return array("I", data).tolist()


@pytest.fixture
def stub():
    srv = DgdsServer("127.0.0.1", 0, max_depth=16).start()
    with grpc.insecure_channel(srv.address) as ch:
        yield pb_grpc.DraftServerStub(ch)
    srv.stop(0)


def test_sync_appends_and_fetches_many_groups_in_one_message(stub):
    for g in ("a", "b"):
        stub.RegisterGroup(pb.RegisterGroupRequest(group_id=g, ttl_seconds=30), timeout=5)
    req = pb.SyncRequest(group_ids=["a", "b", "ghost"], request_ids=["r0", "r1", "r0", "x"], append_group=[0, 0, 1, 2],
                         append_prev=[0, 0, 2, 0], append_len=[3, 2, 1, 1], tokens=u32([1, 2, 3, 4, 5, 9, 7]))
    r = stub.Sync(req, timeout=5)
    assert list(r.append_status) == [pb.APPLIED, pb.APPLIED, pb.BUFFERED, pb.UNKNOWN_GROUP]
    assert list(r.committed) == [3, 2, 0, 0] and list(r.unknown_groups) == [2] and not r.ended_groups
    # fetch both groups from scratch, on a stream; then again from where the first answer left off
    fetch = pb.SyncRequest(group_ids=["b", "a", "ghost"], fetch_group=[0, 1, 2], fetch_cursor=[0, 0, 0], fetch_known=[0, 0, 0])
    [first] = stub.SyncStream(iter([fetch]), timeout=5)
    assert list(first.fetch_segments) == [0, 2, 0] and list(first.fetch_new_requests) == [1, 2, 0]
    assert list(first.request_ids) == ["r0", "r0", "r1"]  # b's one request (no segment yet), then a's two
    assert unpack(first.segments) == [0, 0, 3, 1, 0, 2] and unpack(first.tokens) == [1, 2, 3, 4, 5]
    assert list(first.fetch_next) == [0, 2, 0]
    again = pb.SyncRequest(group_ids=["a", "b"], request_ids=["r0"], append_group=[1], append_prev=[0], append_len=[2],
                           tokens=u32([8, 8]), fetch_group=[0, 1], fetch_cursor=[2, 0], fetch_known=[2, 1])
    r = stub.Sync(again, timeout=5)
    assert list(r.append_status) == [pb.APPLIED] and list(r.committed) == [3]  # b/r0 filled its gap: 8, 8, 9
    assert list(r.fetch_segments) == [0, 0] and list(r.fetch_next) == [2, 0]  # fetches come before the appends
    r = stub.Sync(pb.SyncRequest(group_ids=["b"], fetch_group=[0], fetch_cursor=[0], fetch_known=[1]), timeout=5)
    assert unpack(r.segments) == [0, 0, 2, 0, 2, 1] and unpack(r.tokens) == [8, 8, 9] and not r.request_ids
    # the same log through the readable FetchCst
    inc = stub.FetchCst(pb.FetchCstRequest(caches=[pb.CacheState(group_id="b")]), timeout=5).groups[0]
    assert [(s.request_id, s.start, list(s.tokens)) for s in inc.segments] == [("r0", 0, [8, 8]), ("r0", 2, [9])]


def test_sync_cuts_fetches_at_max_tokens(stub):
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=30), timeout=5)
    stub.Sync(pb.SyncRequest(group_ids=["g"], request_ids=["r"] * 3, append_group=[0] * 3, append_prev=[0, 2, 4],
                             append_len=[2, 2, 2], tokens=u32(range(6))), timeout=5)
    r = stub.Sync(pb.SyncRequest(group_ids=["g"], fetch_group=[0, 0], fetch_cursor=[0, 1], fetch_known=[0, 1],
                                 max_tokens=3), timeout=5)
    assert list(r.fetch_next) == [1, 2] and list(r.fetch_segments) == [1, 1] and list(r.more) == [0, 1]
    assert unpack(r.tokens) == [0, 1, 2, 3]  # the first fetch's segment, then at least one for the second


@pytest.mark.parametrize("bad", [
    dict(request_ids=["r"], append_group=[0], append_prev=[0], append_len=[2], tokens=u32([1])),  # tokens short
    dict(request_ids=["r"], append_group=[5], append_prev=[0], append_len=[1], tokens=u32([1])),  # no group 5
    dict(request_ids=["r"], append_group=[0], append_prev=[-1], append_len=[1], tokens=u32([1])),
    dict(request_ids=[""], append_group=[0], append_prev=[0], append_len=[1], tokens=u32([1])),
    dict(request_ids=["r"], append_group=[0, 0], append_prev=[0], append_len=[1], tokens=u32([1])),
    dict(fetch_group=[0], fetch_cursor=[99], fetch_known=[0]),  # past the log
    dict(fetch_group=[0], fetch_cursor=[0], fetch_known=[7]),  # more request ids than the group has
    dict(tokens=b"\x01\x02\x03"),
])
def test_malformed_sync_is_invalid_and_applies_nothing(stub, bad):
    stub.RegisterGroup(pb.RegisterGroupRequest(group_id="g", ttl_seconds=30), timeout=5)
    ok = dict(request_ids=["ok"], append_group=[0], append_prev=[0], append_len=[1], tokens=u32([5]))
    merged = {**ok, **bad} if "request_ids" not in bad and "tokens" not in bad else bad
    with pytest.raises(grpc.RpcError) as e:
        stub.Sync(pb.SyncRequest(group_ids=["g"], **merged), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    r = stub.Sync(pb.SyncRequest(group_ids=["g"], fetch_group=[0], fetch_cursor=[0], fetch_known=[0]), timeout=5)
    assert not r.tokens and not r.request_ids


@pytest.mark.skipif(not suffix_tree.COMPILED, reason="compares the compiled log with the Python one")
def test_compiled_log_equals_the_python_reference():
    rng = random.Random(3)
    for _ in range(30):
        trees = [(SuffixTree(6, log=True), SuffixTree(6, compiled=False, log=True)) for _ in range(3)]
        for c, p in trees:
            for _ in range(rng.randint(0, 3)):
                c.add_sequence(), p.add_sequence()
            for _ in range(rng.randint(0, 8)):
                if c.seqs:
                    k = rng.randrange(len(c.seqs))
                    toks = [rng.randrange(4) for _ in range(rng.randint(0, 5))]
                    buf = u32([0] + toks)
                    prev = len(c.seqs[k]) if rng.random() < 0.8 else len(c.seqs[k]) + 1
                    assert c.append_at(k, prev, buf, 1, len(toks), 10**6) == p.append_at(k, prev, buf, 1, len(toks), 10**6)
                    assert c.seqs == p.seqs and c.snapshot() == p.snapshot()
        cursors = [rng.randint(0, c.log_size) for c, _ in trees]
        known = [rng.randint(0, len(c.seqs)) for c, _ in trees]
        budget = rng.choice([1, 3, 100])
        with_none = rng.random() < 0.5
        cs = [c.core for c, _ in trees] + ([None] if with_none else [])
        ps = [p.core for _, p in trees] + ([None] if with_none else [])
        extra = [0] if with_none else []
        assert suffix_tree._CORE.log_fetch(cs, cursors + extra, known + extra, budget) == \
            suffix_tree._py_log_fetch(ps, cursors + extra, known + extra, budget)
    c = SuffixTree(4, log=True)
    c.add_sequence()
    with pytest.raises(ValueError):
        c.extend(0, [2**32])  # the log holds uint32 token ids
    assert c.append_at(0, 0, u32([1, 2]), 0, 2, 1) == -2 and c.seqs == [[]]  # over max_tokens: unchanged


def _store_state(store: GroupStore) -> dict:
    out = {}
    for gid, g in sorted(store._groups.items()):
        c = g.tree.core
        [_], _, _, _, segs, toks = suffix_tree.log_fetch([c], [0], [0], 10**9) if g.tree.compiled else \
            suffix_tree._py_log_fetch([c], [0], [0], 10**9)
        out[gid] = (g.tree.snapshot(), [list(s) for s in g.tree.seqs], list(g.request_ids),
                    {k: dict(v) for k, v in g.pending.items()}, g.expires_at, segs, toks)
    return out


@pytest.mark.skipif(not suffix_tree.COMPILED, reason="the compiled sync against GroupStore.sync")
@pytest.mark.parametrize("lazy,check_every,cached", [(False, 1, False), (True, 1, False), (True, 97, False), (True, 7, True)],
                         ids=["eager", "lazy", "lazy-read-late", "one-connection"])
def test_compiled_sync_answers_as_group_store_sync(lazy, check_every, cached):
    """GroupStore.sync_raw (the whole message in C) against GroupStore.sync on the same messages:
    in-order, duplicate, overlapping, gapped, conflicting and empty appends, a request twice, new
    requests, unknown and ended groups, fetches cut by max_tokens; same answers, trees and logs.
    The reference's trees are eager; lazy trees are compared (so built) after every message, or
    only every 97th, so that most appends land in unbuilt trees. ``cached``: every message comes
    on one connection, which keeps its group lookup, naming one of a few group lists again and
    again while groups are finished, registered again and expire between messages."""
    rng = random.Random(11)
    clock = [100.0]
    fast = GroupStore(8, Limits(max_tokens_per_group=700), clock=lambda: clock[0], lazy_trees=lazy)
    ref = GroupStore(8, Limits(max_tokens_per_group=700), clock=lambda: clock[0], lazy_trees=False)
    servicer = DraftServicer(ref, RpcMetrics())
    fast_servicer = DraftServicer(fast, RpcMetrics())
    gids = [f"g{i}" for i in range(5)]
    for s in (fast, ref):
        for g in gids[:4]:
            s.register(g, 30 + int(g[1:]))
        s.finish("g3")  # ended: answered in ended_groups
    lens = {}  # (group, request) -> tokens sent so far
    answered = refused = in_core = 0
    cache = [None] if cached else None
    lists = [rng.sample(gids, rng.randint(1, 5)) for _ in range(3)]
    for msg in range(400):
        clock[0] += 0.5
        names = rng.choice(lists) if cached else rng.sample(gids, rng.randint(1, 5))
        if cached and msg % 11 == 5:  # membership changes between messages
            g, drop = rng.choice(gids), rng.random() < 0.5
            for s in (fast, ref):
                if drop and g in s._groups:
                    s.finish(g)
                else:
                    s.register(g, 3 + int(g[1:]))  # (short leases: some expire on the clock)
        req = pb.SyncRequest(group_ids=names, max_tokens=rng.choice([0, 0, 5, 40]))
        toks: list[int] = []
        for _ in range(rng.randint(0, 6)):
            gi = rng.randrange(len(names))
            rid = f"r{rng.randrange(3)}"
            have = lens.get((names[gi], rid), 0)
            prev = max(0, have + rng.choice([0, 0, 0, 0, -2, 1, 3]))
            m = rng.choice([0, 1, 3, 8, 8])
            req.request_ids.append(rid)
            req.append_group.append(gi)
            req.append_prev.append(prev)
            req.append_len.append(m)
            toks += [rng.randrange(5) for _ in range(m)]
            lens[(names[gi], rid)] = max(have, prev + m)
        req.tokens = u32(toks)
        for gi in range(len(names)):
            if rng.random() < 0.8:
                g = ref._groups.get(names[gi])
                req.fetch_group.append(gi)
                req.fetch_cursor.append(rng.randint(0, g.tree.log_size) if g else rng.randint(0, 3))
                req.fetch_known.append(rng.randint(0, len(g.request_ids)) if g else 0)
        raw = req.SerializeToString()
        try:
            expected = servicer._sync(pb.SyncRequest.FromString(raw))
        except TooLarge:  # (over a limit: both refuse it whole, and neither applies any of it)
            with pytest.raises(TooLarge):
                fast_servicer._sync_raw(raw, cache)
            refused += 1
            assert _store_state(fast) == _store_state(ref), msg
            continue
        got = fast.sync_raw(raw, cache)  # None: left to GroupStore.sync, as the server does
        in_core += got is not None
        got = got if got is not None else fast_servicer._sync(pb.SyncRequest.FromString(raw)).SerializeToString()
        assert pb.SyncResponse.FromString(got) == expected, msg
        if msg % check_every == check_every - 1:
            assert _store_state(fast) == _store_state(ref), msg
        answered += 1
    assert _store_state(fast) == _store_state(ref)
    # (the core leaves to GroupStore.sync what names a group with batches pending, frequent here)
    assert answered > 300 and refused > 0 and in_core >= 50


@pytest.mark.skipif(not suffix_tree.COMPILED, reason="the compiled sync's parser")
def test_compiled_sync_leaves_what_it_does_not_take_to_group_store_sync():
    """Malformed messages (or encodings the C parser does not take) are answered None and change
    nothing; unpacked repeated fields and unknown fields parse as protobuf does."""
    store = GroupStore(8)
    store.register("g", 30)
    before = _store_state(store)
    ok = dict(group_ids=["g"], request_ids=["r"], append_group=[0], append_prev=[0], append_len=[2], tokens=u32([1, 2]))
    for bad in (dict(tokens=u32([1])), dict(append_group=[3]), dict(append_prev=[-1]), dict(request_ids=[""]),
                dict(append_len=[2, 2]), dict(fetch_group=[0], fetch_cursor=[5], fetch_known=[0]),
                dict(fetch_group=[0], fetch_cursor=[0], fetch_known=[2])):
        assert store.sync_raw(pb.SyncRequest(**{**ok, **bad}).SerializeToString()) is None
    assert store.sync_raw(b"\x0a\x05g") is None  # truncated
    assert store.sync_raw(b"\x0a\x02\xff\xfe") is None  # not UTF-8
    assert _store_state(store) == before

    def varint(v: int) -> bytes:
        out = b""
        while v >= 0x80:
            out += bytes([v & 0x7F | 0x80])
            v >>= 7
        return out + bytes([v])

    # fields 3, 4, 5 unpacked (one varint each), an unknown field 15 (fixed32) and 16 (bytes)
    raw = (b"\x0a\x01g" + b"\x12\x01r" + b"\x18" + varint(0) + b"\x20" + varint(0) + b"\x28" + varint(2) +
           b"\x32\x08" + u32([1, 2]) + b"\x7d\x01\x02\x03\x04" + b"\x82\x01\x02hi")
    assert pb.SyncRequest.FromString(raw).append_len == [2]
    got = pb.SyncResponse.FromString(store.sync_raw(raw))
    assert list(got.append_status) == [pb.APPLIED] and list(got.committed) == [2]
    assert store.tree("g").seqs == [[1, 2]]
