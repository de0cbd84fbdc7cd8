"""Session-sticky routing: every turn of a trajectory on the engine its first turn ran on (verl, slime).

What the multi-turn frameworks ship today (verl's agent loop behind a sticky load balancer, slime's
routing key, ROLL's environment affinity): a trajectory's first request goes to the least busy
engine, and every later request of the same session goes back to it, because that engine's prefix
cache is the only place its history's KV lives. It is the baseline of the multi-turn comparison
(bench.multiturn_compare) and is not meant for training runs (Seer's policies place each turn on
any instance and load the prefix from the KV pool). Use it by path:

    scheduler.policy: seer.scheduler.policies.sticky:SessionSticky

Ready requests are served first come first served (an agent loop sends a turn the moment its
tool answers). Admission is the engine's, as in those frameworks: no KV-budget check, the engine
queues and preempts (`scheduler.max_running`, when set, still caps the chunks in flight on one
engine). `chunk_size` is honoured as given; the comparison gives it a whole trajectory's budget, so
every turn is one engine request, as verl sends it. A session whose engine is down moves to the
least busy live one (which recomputes its history) and sticks there.

`homes` (request id -> instance) places sessions that an earlier iteration started (APRIL-style
partial rollout carries unfinished trajectories over): they go back to their engine as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from seer.scheduler.config import DEFAULTS
from seer.scheduler.buffer import Request
from seer.scheduler.chunks import chunk_max_tokens
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import InstanceLoad, PlacementConfig, kv_reservation, reservation_block_size
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.index import PriorityIndex


@dataclass(frozen=True)
class Route:
    """Where a session's next chunk goes and why: "sticky" (its engine), "first" (a new session on the
    least busy engine) or "rehome" (its engine is down or at its cap of chunks, so it moves)."""

    instance: str
    reason: str


def session_route(home: str | None, loads: Sequence[InstanceLoad], max_running: int | None = None) -> Route | None:
    """The engine for a session whose history is on `home` (None: a new session). Pure.

    A live `home` keeps the session even when it is full (the engine queues: moving would recompute
    the history, which is exactly what sticky routing avoids), unless `max_running` caps it; a new
    or orphaned session takes the live engine with the fewest chunks in flight (ties: list order).
    None when no engine is live, or every one is at `max_running`.
    """
    live = [load for load in loads if load.down is None]
    room = [load for load in live if max_running is None or load.running < max_running]
    if home is not None and any(load.name == home for load in live):
        return Route(home, "sticky") if any(load.name == home for load in room) else None
    if not room:
        return None
    best = min(room, key=lambda load: (load.running, load.index))
    return Route(best.name, "first" if home is None else "rehome")


class SessionSticky(Policy):
    name = "sticky"

    def __init__(self, chunk_size: int | None = DEFAULTS.chunk_size, placement: PlacementConfig | None = None,
                 homes: Mapping[str, str] | None = None) -> None:
        super().__init__(chunk_size, placement)
        self._ready = PriorityIndex()  # key: (arrival in the ready queue,)
        self._arrivals = 0
        self._homes = dict(homes or {})
        self._routes: dict[str, int] = {"first": 0, "sticky": 0, "rehome": 0}

    def home(self, req: Request) -> str | None:
        """Where the session's history is: its last chunk's engine (sticky routing never moves it
        voluntarily, so that is its first engine), else where an earlier iteration ran it."""
        return req.last_instance or self._homes.get(req.request_id)

    def on_ready(self, req: Request) -> None:
        self._ready.add(req, (self._arrivals,))
        self._arrivals += 1

    def on_dispatched(self, decision: Dispatch) -> None:
        self._ready.discard(decision.request)
        self._routes[decision.reason] += 1

    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        if not len(self._ready):
            return Wait("idle")
        # the first ready session whose engine takes it (all but the first only under max_running)
        found = next(((req, route) for req in self._ready
                      if (route := session_route(self.home(req), loads, self.placement.max_running)) is not None), None)
        if found is None:
            return Wait("kv_full")
        req, route = found
        block = reservation_block_size(loads, self.placement)
        max_tokens = chunk_max_tokens(self.chunk_size, req.max_tokens, req.generated,
                                      context_len=req.context_len, block_size=block)
        need = kv_reservation(req.context_len, max_tokens, self.placement, block)
        return Dispatch(req, route.instance, max_tokens, need, route.reason)

    def summary(self) -> dict:
        return {"routes": dict(self._routes)}
