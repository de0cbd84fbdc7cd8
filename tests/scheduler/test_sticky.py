"""Session-sticky routing (seer.scheduler.policies.sticky), on hand-built state: a new session goes to
the least busy engine, every later turn back to it whatever the loads, orphans move once."""

from __future__ import annotations

from seer.scheduler import SchedulerConfig
from seer.scheduler.decisions import Dispatch, Wait
from seer.scheduler.placement import PlacementConfig
from seer.scheduler.policies.sticky import Route, SessionSticky, session_route

from tests.scheduler.sched_helpers import loads, request

STICKY = "seer.scheduler.policies.sticky:SessionSticky"


def test_session_route_is_pure_and_keeps_a_session_on_its_engine():
    ls = loads(1000, 1000, 1000)
    ls[0].running, ls[1].running, ls[2].running = 5, 0, 2
    assert session_route(None, ls) == Route("i1", "first")  # least busy
    assert session_route("i0", ls) == Route("i0", "sticky")  # busiest, still home
    assert [(l.running, l.reserved_tokens) for l in ls] == [(5, 0), (0, 0), (2, 0)]  # loads untouched
    ls[0].down = "dead"
    assert session_route("i0", ls) == Route("i1", "rehome")
    assert session_route("i2", ls, max_running=2) is None  # its engine is at the cap: wait, do not move
    ls[1].running = ls[2].running = 2
    assert session_route(None, ls, max_running=2) is None


def test_every_turn_goes_back_to_the_first_engine_even_when_another_is_idle():
    pol = SessionSticky(chunk_size=None, placement=PlacementConfig(block_size=1))
    a, b = request(0, 0, seq=0), request(0, 1, seq=1)
    ls = loads(100, 100)
    for r in (a, b):
        pol.on_ready(r)
    first = pol.pick(ls)
    assert isinstance(first, Dispatch) and (first.request, first.instance, first.reason) == (a, "i0", "first")
    a.instances.append("i0")
    ls[0].running += 1
    pol.on_dispatched(first)
    second = pol.pick(ls)
    assert (second.request, second.instance) == (b, "i1")
    assert second.max_tokens == b.max_tokens  # no chunking: the whole turn is one engine request
    b.instances.append("i1")
    pol.on_dispatched(second)
    # a's turn ended, its tool answered: back to i0 although i0 is loaded and i1 is now idle
    ls[0].running, ls[0].reserved_tokens = 9, 10_000
    a.generated_ids = [7] * 20
    pol.on_ready(a)
    again = pol.pick(ls)
    assert (again.instance, again.reason) == ("i0", "sticky")
    pol.on_dispatched(again)
    assert isinstance(pol.pick(ls), Wait)
    assert pol.summary() == {"routes": {"first": 2, "sticky": 1, "rehome": 0}}


def test_sessions_carried_from_an_earlier_iteration_go_back_to_their_engine():
    pol = SessionSticky(chunk_size=64, placement=PlacementConfig(block_size=1), homes={request(0, 0).request_id: "i1"})
    r = request(0, 0)
    pol.on_ready(r)
    d = pol.pick(loads(100, 100))
    assert (d.instance, d.reason, d.max_tokens) == ("i1", "sticky", 64)


def test_a_session_blocked_by_its_engines_cap_does_not_hold_back_the_others():
    pol = SessionSticky(chunk_size=None, placement=PlacementConfig(max_running=1))
    a, b = request(0, 0, seq=0), request(1, 0, seq=1)
    a.instances.append("i0")
    ls = loads(100, 100)
    ls[0].running = 1
    pol.on_ready(a)
    pol.on_ready(b)
    d = pol.pick(ls)
    assert (d.request, d.instance) == (b, "i1")


def test_the_config_builds_it_by_path_with_homes_as_a_policy_argument():
    cfg = SchedulerConfig(policy=STICKY, policy_args={"homes": {"x": "i0"}}, chunk_size=32)
    assert cfg.check_policy() is SessionSticky
    pol = cfg.build_policy()
    assert isinstance(pol, SessionSticky) and pol.chunk_size == 32 and pol.name == "sticky"
