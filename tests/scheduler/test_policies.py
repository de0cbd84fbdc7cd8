"""Each policy on hand-built states, against the paper's rules (Algorithm 2 and its baselines)."""

import pytest

from sched_helpers import finished, loads, request
from seer.scheduler.config import SchedulerConfig
from seer.scheduler.decisions import Dispatch, Wait
from seer.scheduler.placement import PlacementConfig
from seer.scheduler.policies import (
    POLICIES, ContextAware, DividedFifo, GroupRoundRobin, OracleLongestFirst, make_policy,
    true_lengths_from_samples,
)

BIG = loads(10**9, 10**9)
CFG = PlacementConfig(block_size=1, kv_budget_fraction=1.0)


def drain(policy, ls=BIG, limit=100):
    """Dispatch until the policy waits; returns the dispatched request ids in order."""
    out = []
    for _ in range(limit):
        d = policy.pick(ls)
        if isinstance(d, Wait):
            break
        policy.on_dispatched(d)
        out.append(d.request.request_id)
    return out


# -- context (Algorithm 2) ---------------------------------------------------------------------

def test_probes_go_first_shortest_generated_first():
    p = ContextAware(chunk_size=100, placement=CFG)
    reqs = [request(0, 1), request(0, 0, generated=300), request(1, 0, generated=100),
            request(2, 0, generated=200), request(1, 1)]
    for r in reqs:
        p.on_ready(r)
    order = drain(p)
    assert order[:3] == ["g1-s0", "g2-s0", "g0-s0"]  # probes, by generated 100 < 200 < 300
    assert set(order[3:]) == {"g0-s1", "g1-s1"}
    assert p.summary()["dispatches_by_reason"] == {"probe": 3, "longest": 2}


def test_largest_group_estimate_next_and_unknown_counts_as_maximum():
    p = ContextAware(chunk_size=100, placement=CFG)
    # group 0: probe finished at 50; group 1: probe finished at 800; group 2: nothing finished.
    for g, length in ((0, 50), (1, 800)):
        probe = finished(request(g, 0), length)
        p.on_ready(request(g, 0))  # register the group, then finish its probe
        p.on_dispatched(Dispatch(request(g, 0), "i0", 1, 1, "probe"))
        p.on_finished(probe)
    for g in (0, 1, 2):
        p.on_ready(request(g, 1))
    assert p.estimate(0) == 50 and p.estimate(1) == 800 and p.estimate(2) == 1000
    assert drain(p) == ["g2-s1", "g1-s1", "g0-s1"]


@pytest.mark.parametrize("turn_tokens, order", [(0, ["g1-s1", "g0-s1"]), (64, ["g0-s1", "g1-s1"])])
def test_multi_turn_estimate_prices_turns_in_tokens(turn_tokens, order):
    """Group 0's finished trajectory: 300 tokens over 6 turns; group 1's: 500 tokens in 1 turn.
    By tokens group 1 is longer; with each turn worth 64 tokens group 0 is (300 + 6 x 64 > 500 + 64)."""
    p = ContextAware(chunk_size=100, placement=CFG, turn_tokens=turn_tokens)
    for g, length, turns in ((0, 300, 6), (1, 500, 1)):
        p.on_ready(request(g, 0))
        p.on_dispatched(Dispatch(request(g, 0), "i0", 1, 1, "probe"))
        probe = finished(request(g, 0), length)
        probe.turns = turns
        p.on_finished(probe)
    for g in (0, 1):
        p.on_ready(request(g, 1))
    assert (p.turns_estimate(0), p.turns_estimate(1)) == (6, 1)
    assert drain(p) == order


def test_a_partial_trajectory_with_more_turns_raises_its_groups_priority():
    p = ContextAware(chunk_size=100, placement=CFG, turn_tokens=64)
    for g, length in ((0, 400), (1, 500)):
        p.on_ready(request(g, 0))
        p.on_dispatched(Dispatch(request(g, 0), "i0", 1, 1, "probe"))
        p.on_finished(finished(request(g, 0), length))
    waiting = [request(0, 1), request(1, 1)]
    for r in waiting:
        p.on_ready(r)
    back = request(0, 2, generated=100)
    back.turns = 3  # a sibling back from its third tool call: group 0 is now 400 + 3 x 64 > 500
    p.on_ready(back)
    assert drain(p) == ["g0-s2", "g0-s1", "g1-s1"]


def test_estimate_updates_on_each_finish_and_reorders_waiting_requests():
    p = ContextAware(chunk_size=100, placement=CFG)
    a, b = request(0, 1), request(1, 1)
    p.on_ready(a)
    p.on_ready(b)
    p.on_finished(finished(request(0, 2), 10))
    p.on_finished(finished(request(1, 2), 20))
    assert p.pick(BIG).request is b  # 20 > 10
    p.on_finished(finished(request(0, 3), 30))  # group 0's longest is now 30
    assert p.estimate(0) == 30 and p.pick(BIG).request is a
    p.on_finished(finished(request(0, 4), 5))  # a shorter finish never lowers the estimate
    assert p.estimate(0) == 30


def test_estimate_is_conservative_when_a_partial_response_is_already_longer():
    p = ContextAware(chunk_size=100, placement=CFG)
    p.on_ready(request(0, 1))
    p.on_finished(finished(request(0, 2), 40))
    assert p.estimate(0) == 40
    p.on_ready(request(0, 3, generated=300))  # back from a chunk with 300 tokens and still going
    assert p.estimate(0) == 300


def test_pick_has_no_side_effects():
    p = ContextAware(chunk_size=100, placement=CFG)
    for r in (request(0, 0), request(0, 1), request(1, 1)):
        p.on_ready(r)
    first = p.pick(BIG)
    assert p.pick(BIG) == first


def test_no_starvation_under_a_flood_of_higher_priority_work():
    """A short-estimate request keeps losing to fresh unknown-length work, yet is served in time."""
    p = ContextAware(chunk_size=100, placement=CFG, starvation_after=20, starvation_every=5)
    victim = request(0, 1, seq=0)
    p.on_ready(victim)
    p.on_finished(finished(request(0, 0), 1))  # its group is known to be tiny
    served_at = None
    for i in range(200):
        p.on_ready(request(1000 + i, 1, seq=10 + i))  # every round a new unknown (max-length) request
        d = p.pick(BIG)
        p.on_dispatched(d)
        if d.request is victim:
            served_at = i
            assert d.reason == "starvation"
            break
    assert served_at is not None and served_at <= 20


def test_starvation_guard_is_rationed_so_ordering_survives_a_full_queue():
    p = ContextAware(chunk_size=100, placement=CFG, starvation_after=1, starvation_every=4)
    for g in range(40):
        p.on_ready(request(g, 1))
    drain(p, limit=40)
    by_reason = p.summary()["dispatches_by_reason"]
    assert by_reason["starvation"] <= 10 and by_reason["longest"] >= 30


def test_context_waits_when_no_instance_has_kv_room():
    p = ContextAware(chunk_size=100, placement=CFG)
    p.on_ready(request(0, 0, generated=10, prompt_len=40))  # a continuation reserves its whole chunk
    full = loads(1000, 1000, reserved=(900, 861))  # chunk needs 50 + 100 - 1 = 149
    assert p.pick(full) == Wait("kv_full")
    roomy = loads(1000, 1000, reserved=(900, 851))
    d = p.pick(roomy)
    assert isinstance(d, Dispatch) and d.instance == "i1" and d.kv_tokens == 149


def test_context_idle_when_nothing_ready():
    assert ContextAware().pick(BIG) == Wait("idle")


# -- chunk size rule, shared by the chunking policies ----------------------------------------------

@pytest.mark.parametrize("name", ["divided", "context"])
def test_dispatch_max_tokens_is_min_of_chunk_and_remaining(name):
    p = make_policy(name, chunk_size=300, placement=CFG)
    p.on_ready(request(0, 1, generated=850, max_tokens=1000))
    d = p.pick(BIG)
    assert d.max_tokens == 150 and d.kv_tokens == 4 + 850 + 150 - 1  # the last token gets no KV
    p2 = make_policy(name, chunk_size=300, placement=CFG)
    p2.on_ready(request(0, 1, generated=100, max_tokens=1000))
    assert p2.pick(BIG).max_tokens == 300


def test_chunk_prefers_the_instance_holding_its_prefix():
    p = DividedFifo(chunk_size=100, placement=PlacementConfig(block_size=1, affinity_gap_tokens=512,
                                                              affinity_gap_fraction=0.0))
    r = request(0, 1, generated=100)
    r.instances = ["i0", "i1"]
    p.on_ready(r)
    ls = loads(10_000, 10_000, reserved=(1000, 1400))  # i0 freer by 400 < 512: stay on i1
    assert p.pick(ls).instance == "i1"
    ls = loads(10_000, 10_000, reserved=(1000, 1600))  # 600 > 512: move
    assert p.pick(ls).instance == "i0"


# -- divided -------------------------------------------------------------------------------------

def test_divided_is_fifo_and_a_returning_request_goes_to_the_back():
    p = DividedFifo(chunk_size=100, placement=CFG)
    a, b, c = request(0, 0), request(0, 1), request(1, 0)
    for r in (a, b, c):
        p.on_ready(r)
    d = p.pick(BIG)
    assert d.request is a and d.reason == "fifo"
    p.on_dispatched(d)
    p.on_ready(a)  # back after its first chunk
    assert drain(p) == ["g0-s1", "g1-s0", "g0-s0"]


def test_divided_continuations_first_keeps_each_requests_arrival_place():
    """The ladder's divided rollout: a request back from a chunk goes before every request not yet
    started, and started requests among themselves keep their first arrival order."""
    p = DividedFifo(chunk_size=100, placement=CFG, continuations_first=True)
    a, b, c = request(0, 0), request(0, 1), request(1, 0)
    for r in (a, b, c):
        p.on_ready(r)
    for _ in range(2):  # a and b each run a chunk; b comes back first
        p.on_dispatched(p.pick(BIG))
    p.on_ready(b)
    p.on_ready(a)
    assert drain(p) == ["g0-s0", "g0-s1", "g1-s0"]
    assert SchedulerConfig(policy="divided", continuations_first=True).build_policy().continuations_first


def test_divided_balances_on_free_kv():
    p = DividedFifo(chunk_size=100, placement=CFG)
    p.on_ready(request(0, 0))
    assert p.pick(loads(10_000, 10_000, 10_000, reserved=(300, 100, 200))).instance == "i1"


# -- group_rr (baseline) -------------------------------------------------------------------------

def test_group_rr_sends_whole_groups_round_robin_unchunked_and_unbounded():
    p = GroupRoundRobin(chunk_size=100, placement=CFG)  # chunk_size is ignored
    for g in range(3):
        for k in range(2):
            p.on_ready(request(g, k, seq=g * 2 + k))
    tiny = loads(10, 10)  # no KV bound in the baseline
    picks = []
    while not isinstance(d := p.pick(tiny), Wait):
        p.on_dispatched(d)
        picks.append((d.request.request_id, d.instance, d.max_tokens))
    assert picks == [
        ("g0-s0", "i0", 1000), ("g0-s1", "i0", 1000),
        ("g1-s0", "i1", 1000), ("g1-s1", "i1", 1000),
        ("g2-s0", "i0", 1000), ("g2-s1", "i0", 1000),
    ]


def test_group_rr_pick_does_not_assign_until_dispatched():
    p = GroupRoundRobin(placement=CFG)
    p.on_ready(request(0, 0))
    p.on_ready(request(1, 0, seq=1000))
    assert p.pick(BIG).instance == "i0"
    assert p.pick(BIG).instance == "i0"  # asking twice does not advance the round-robin
    p.on_dispatched(p.pick(BIG))
    assert p.pick(BIG).instance == "i1"


# -- oracle ----------------------------------------------------------------------------------------

def test_oracle_orders_by_true_remaining_length():
    lengths = {(0, 0): 100, (0, 1): 900, (1, 0): 500, (1, 1): 700}
    p = OracleLongestFirst(lengths, chunk_size=100, placement=CFG)
    for g, k in lengths:
        p.on_ready(request(g, k, generated=300 if (g, k) == (0, 1) else 0))
    # remaining: g0-s1 600, g1-s1 700, g1-s0 500, g0-s0 100
    assert drain(p) == ["g1-s1", "g0-s1", "g1-s0", "g0-s0"]


def test_oracle_fails_loudly_without_a_length():
    p = OracleLongestFirst({}, chunk_size=100)
    with pytest.raises(KeyError, match="group 0 sample 1"):
        p.on_ready(request(0, 1))


def test_only_the_oracle_can_be_given_true_lengths():
    lengths = {(0, 0): 10}
    assert isinstance(make_policy("oracle_lfs", true_lengths=lengths), OracleLongestFirst)
    with pytest.raises(ValueError, match="needs true_lengths"):
        make_policy("oracle_lfs")
    for name in set(POLICIES) - {"oracle_lfs"}:
        with pytest.raises(ValueError, match="may not read true lengths"):
            make_policy(name, true_lengths=lengths)
        with pytest.raises(TypeError):  # not even by going around the registry
            POLICIES[name](true_lengths=lengths)


def test_true_lengths_from_a_previous_run():
    from seer.types import PromptSpec, Sample
    pr = PromptSpec(0, "", [1], {})
    s = Sample(3, 1, "g3-s1", pr, [1, 2, 3], [0.0] * 3, "stop", 0.0, 1.0, ["i0"])
    assert true_lengths_from_samples([s]) == {(3, 1): 3}


def test_unknown_policy_name():
    with pytest.raises(ValueError, match="unknown scheduler policy"):
        make_policy("lottery")


@pytest.mark.parametrize("name", ["divided", "context", "group_rr"])
def test_reservation_uses_the_instances_block_size(name):
    extra = {"early_packing": False} if name == "context" else {}  # the whole chunk reserved
    p = make_policy(name, chunk_size=256, placement=PlacementConfig(block_size=16, kv_budget_fraction=1.0), **extra)
    p.on_ready(request(0, 1, generated=0, max_tokens=2048, prompt_len=60))
    ls = loads(100_000, 100_000)
    for load in ls:
        load.block_size = 128
    d = p.pick(ls)
    assert d.kv_tokens % 128 == 0 and d.kv_tokens >= 60 + d.max_tokens - 1
    if name != "group_rr":  # chunks end where their KV fills the last block exactly: no waste
        assert (d.max_tokens, d.kv_tokens) == (197, 256)


def test_context_continues_started_requests_before_fresh_ones_of_the_same_estimate():
    """Every group is unknown (estimate = maximum) early on: a request back from a chunk goes before
    requests not yet started, and the one that has generated most goes first (heavy tails: the
    more a request has generated, the longer it is expected to run)."""
    for cf in (True, False):
        p = ContextAware(chunk_size=100, placement=CFG, continuations_first=cf)
        fresh = [request(g, 1) for g in range(3)]
        for r in fresh:
            p.on_ready(r)
        p.on_ready(request(5, 2, generated=200))
        p.on_ready(request(4, 3, generated=400))
        assert drain(p)[:2] == ["g4-s3", "g5-s2"]


def _two_groups(**kw):
    """A started request of a known group (L = 350), a fresh one of an unknown group, and two
    started requests of known groups L = 350 (generated 100) and L = 900 (generated 50)."""
    q = ContextAware(chunk_size=100, placement=CFG, **kw)
    q.on_ready(request(0, 1, generated=300))
    q.on_finished(finished(request(0, 2), 350))
    q.on_ready(request(1, 1))
    q.on_finished(finished(request(2, 2), 900))
    q.on_ready(request(2, 1, generated=50))
    q.on_ready(request(0, 3, generated=100))
    return drain(q)


def test_context_continuations_first_never_pause_a_started_request_for_a_new_one():
    """A request back from a chunk continues before any request not yet started, whatever the
    estimates (so the within-group outliers, whose groups look short, do not wait between their
    chunks); started requests among themselves and new ones among themselves keep Algorithm 2's
    order (largest estimate, then most generated)."""
    assert _two_groups(continuations_first=True) == ["g2-s1", "g0-s1", "g0-s3", "g1-s1"]


def test_context_without_continuations_first_is_algorithm_2_as_written():
    # a known shorter group goes after the unknown one, whatever it has generated
    assert _two_groups() == ["g1-s1", "g2-s1", "g0-s1", "g0-s3"]


# -- early packing (context): reservations follow what a chunk is expected to generate -----------

def _known(p, group, length, index=9):
    """Register `group` and finish one of its requests at `length` tokens."""
    r = request(group, index)
    p.on_ready(r)
    p.on_dispatched(Dispatch(r, "i0", 1, 1, "longest"))
    p.on_finished(finished(r, length))


def test_early_packing_fresh_request_of_an_unknown_group_reserves_only_its_prompt():
    p = ContextAware(chunk_size=100, placement=CFG, early_packing=True)
    p.on_ready(request(0, 0, prompt_len=50))
    d = p.pick(BIG)
    assert d.max_tokens == 100 and d.kv_tokens == 50  # the chunk may still generate 100 tokens
    off = ContextAware(chunk_size=100, placement=CFG, early_packing=False)
    off.on_ready(request(0, 0, prompt_len=50))
    assert off.pick(BIG).kv_tokens == 149
    # a request that already ran a chunk while nothing in its group finished: the likely long one
    q = ContextAware(chunk_size=100, placement=CFG, early_packing=True)
    q.on_ready(request(0, 3, generated=100, prompt_len=50))
    assert q.pick(BIG).kv_tokens == 50 + 100 + 100 - 1


def test_early_packing_known_group_reserves_up_to_its_estimate_and_outgrown_requests_their_chunk():
    p = ContextAware(chunk_size=100, placement=CFG, early_packing=True)
    _known(p, 0, 30)  # L_0 = 30
    _known(p, 1, 500)  # L_1 = 500
    p.on_ready(request(0, 2, generated=40, prompt_len=10))  # outgrew its group: the whole chunk
    p.on_ready(request(0, 1, prompt_len=10))  # fresh: the estimate, raised to the partial 40
    p.on_ready(request(1, 1, generated=450, prompt_len=10))  # 50 left to the estimate
    p.on_ready(request(1, 2, prompt_len=10))  # estimate 500 > chunk: the whole chunk
    got = {}
    while not isinstance(d := p.pick(BIG), Wait):
        p.on_dispatched(d)
        got[d.request.request_id] = d.kv_tokens
    assert got == {"g0-s1": 10 + 40 - 1, "g0-s2": 50 + 100 - 1, "g1-s1": 460 + 50 - 1, "g1-s2": 10 + 100 - 1}


def test_early_packing_admits_more_requests_into_the_same_budget():
    def admitted(policy):
        ls = loads(1000)
        for g in range(10):
            policy.on_ready(request(g, 1, prompt_len=50))
        n = 0
        while not isinstance(d := policy.pick(ls), Wait):
            policy.on_dispatched(d)
            ls[0].reserved_tokens += d.kv_tokens
            ls[0].running += 1
            n += 1
        assert ls[0].reserved_tokens <= 1000  # the budget holds for what was reserved
        return n

    assert admitted(ContextAware(chunk_size=100, placement=CFG, early_packing=False)) == 6  # 6 x 149
    assert admitted(ContextAware(chunk_size=100, placement=CFG, early_packing=True)) == 10  # 10 x 50: everyone starts


def test_oracle_reserves_exactly_what_the_chunk_will_generate():
    p = OracleLongestFirst({(0, 1): 30, (1, 1): 900}, chunk_size=100, placement=CFG)
    p.on_ready(request(0, 1, prompt_len=10))
    p.on_ready(request(1, 1, generated=850, prompt_len=10))
    got = {}
    while not isinstance(d := p.pick(BIG), Wait):
        p.on_dispatched(d)
        got[d.request.request_id] = (d.max_tokens, d.kv_tokens)
    assert got == {"g1-s1": (100, 860 + 50 - 1), "g0-s1": (100, 10 + 30 - 1)}


# -- engine priority (context): a full engine preempts the chunk with the least progress --------

def test_engine_priority_ranks_chunks_by_progress_and_is_off_by_default():
    p = ContextAware(chunk_size=100, placement=CFG, engine_priority=True)
    p.on_ready(request(0, 0, prompt_len=10))  # the probe, fresh
    p.on_ready(request(0, 1, generated=300, prompt_len=10))  # a long request's continuation
    got = {}
    while not isinstance(d := p.pick(BIG), Wait):
        p.on_dispatched(d)
        got[d.request.request_id] = d.priority
    assert got == {"g0-s0": 0, "g0-s1": -300}  # lower = preempted last (vLLM's convention)
    off = ContextAware(chunk_size=100, placement=CFG)
    off.on_ready(request(0, 1, generated=300, prompt_len=10))
    assert off.pick(BIG).priority == 0
    for other in (DividedFifo(chunk_size=100, placement=CFG), GroupRoundRobin(placement=CFG)):
        other.on_ready(request(0, 1, generated=300, prompt_len=10))
        assert other.pick(BIG).priority == 0
