"""Server store + client replica: idempotent, reorder-safe updates and incremental fetches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from seer.dgds.server.group_store import GroupStore, Limits, Malformed, TooLarge, UnknownGroups, Update, UpdateStatus
from seer.dgds.client.replica import GroupReplica

from .brute import substring_counts


@st.composite
def scenarios(draw):
    """Requests' token streams cut into batches, then a delivery schedule with duplicates and
    reordering, interleaved with the replica's own appends and its fetches."""
    n_req = draw(st.integers(1, 4))
    streams = [draw(st.lists(st.integers(0, 3), max_size=25)) for _ in range(n_req)]
    own = draw(st.sets(st.integers(0, n_req - 1)))  # requests the replica's instance generates
    batches = []
    for r, toks in enumerate(streams):
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(toks) - 1)), max_size=5)))
        bounds = [0] + [c for c in cuts if c < len(toks)] + [len(toks)]
        for a, b in zip(bounds, bounds[1:]):
            if b > a:
                batches.append((r, a, tuple(toks[a:b])))
    deliveries = draw(st.permutations(batches))
    dups = draw(st.lists(st.sampled_from(batches), max_size=4)) if batches else []
    ops = [("send", b) for b in list(deliveries) + dups]
    ops += [("fetch", None)] * draw(st.integers(0, 6))
    ops += [("own", b) for b in batches if b[0] in own]  # the instance generated this batch
    ops = draw(st.permutations(ops))
    max_fetch = draw(st.sampled_from([0, 1, 3]))
    return streams, own, ops, max_fetch


def _drain(store, replica, max_fetch):
    while True:
        [d] = store.fetch([("g", replica.cursor)], max_fetch)
        assert replica.apply_delta(d.start, d.next, d.segments)
        if not d.more:
            return


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_replica_equals_server_tree_after_any_interleaving(scenario):
    streams, own, ops, max_fetch = scenario
    store = GroupStore(max_depth=6, limits=Limits(max_pending_per_request=64))
    store.register("g", 60)
    replica = GroupReplica("g", 6)
    def local_upto(r, end):
        have = replica.length(f"r{r}")
        if end > have:
            replica.append_local(f"r{r}", streams[r][have:end])

    for kind, arg in ops:
        if kind == "send":
            r, start, toks = arg
            if r in own:  # the client applies its own tokens before it sends them
                local_upto(r, start + len(toks))
            [out] = store.update([Update("g", f"r{r}", start, toks)])
            assert out.status != UpdateStatus.CONFLICT
        elif kind == "own":  # generated tokens reach the local replica at once
            r, start, toks = arg
            local_upto(r, start + len(toks))
        else:
            _drain(store, replica, max_fetch)
    # Retries of every batch, then the final catch-up.
    for kind, arg in ops:
        if kind == "send":
            r, start, toks = arg
            [out] = store.update([Update("g", f"r{r}", start, toks)])
            assert out.status == UpdateStatus.DUPLICATE
            assert out.committed_token_count == len(streams[r])
    _drain(store, replica, max_fetch)
    server = store.tree("g")
    assert replica.tree.snapshot() == server.snapshot()
    for r, toks in enumerate(streams):
        if toks:
            assert server.seqs[server_index(store, f"r{r}")] == toks
            assert replica.tokens(f"r{r}") == toks
    counts = substring_counts([s for s in streams], 6)
    assert all(server.count(w) == n for w, n in counts.items())


def server_index(store, request_id):
    return store._groups["g"].request_index[request_id]


def test_update_outcomes():
    store = GroupStore(max_depth=8)
    store.register("g", 60)
    up = lambda prev, toks: store.update([Update("g", "r", prev, toks)])[0]  # noqa: E731
    assert up(3, (4, 5)).status == UpdateStatus.BUFFERED
    o = up(0, (1, 2, 3))
    assert (o.status, o.committed_token_count) == (UpdateStatus.APPLIED, 5)
    assert store.tree("g").seqs[0] == [1, 2, 3, 4, 5]  # the buffered batch joined after the gap
    assert up(0, (1, 2)).status == UpdateStatus.DUPLICATE
    o = up(4, (5, 6, 7))  # overlaps one known token, adds two
    assert (o.status, o.committed_token_count) == (UpdateStatus.APPLIED, 7)
    assert up(6, (9,)).status == UpdateStatus.CONFLICT
    assert store.tree("g").seqs[0] == [1, 2, 3, 4, 5, 6, 7]


def test_validation_and_lifecycle():
    now = [0.0]
    store = GroupStore(max_depth=8, limits=Limits(max_tokens_per_update=4, max_groups=2), clock=lambda: now[0])
    with pytest.raises(UnknownGroups):
        store.update([Update("nope", "r", 0, (1,))])
    store.register("a", 10)
    with pytest.raises(UnknownGroups) as e:  # all-or-nothing: "a" is not touched either
        store.update([Update("a", "r", 0, (1,)), Update("b", "r", 0, (1,))])
    assert e.value.group_ids == ["b"]
    assert store.stats()["tokens"] == 0
    for bad in (Update("a", "", 0, (1,)), Update("a", "r", -1, (1,)), Update("a", "r", 0, (-5,))):
        with pytest.raises(Malformed):
            store.update([bad])
    with pytest.raises(TooLarge):
        store.update([Update("a", "r", 0, (1, 2, 3, 4, 5))])
    with pytest.raises(Malformed):
        store.register("c", 0)
    store.register("b", 5)
    with pytest.raises(TooLarge):
        store.register("c", 5)
    now[0] = 6.0  # "b" expired: its slot frees up
    store.register("c", 5)
    assert store.stats()["groups"] == 2 and store.stats()["expired_total"] == 1
    store.update([Update("a", "r", 0, (1, 2))])  # refreshes "a"'s lease to 16
    now[0] = 12.0
    assert store.reap() == 1  # "c" (expires at 11); "a" lives on
    store.finish("a")
    with pytest.raises(UnknownGroups):
        store.finish("a")
    assert store.stats()["groups"] == 0
