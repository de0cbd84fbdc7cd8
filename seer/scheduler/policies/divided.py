"""Divided rollout without length context: request-level chunks, first come first served.

The ablation step between the baseline and Seer: it gains load balance and KV-bounded
admission from chunking, but orders work by arrival only.

"The request goes back to the buffer" has two readings, and they schedule very differently:

* default: a request back from a chunk joins the end of the queue. Every request gets a chunk
  in turn, like processor sharing, so the longest requests all start early and advance at the
  same pace: this alone removes most of the tail, far more than the paper's divided rollout did
  (docs/bench.md, "Current result", change 4).
* `continuations_first`: a request keeps its place in arrival order, so a started request's
  next chunk goes before every request not yet started (requests run to completion in arrival
  order, each chunk on the instance with the most free KV). Long requests that arrived late
  start late and finish late: the straggler tail that length context is there to remove.
"""

from __future__ import annotations

from collections.abc import Sequence

from seer.scheduler.config import DEFAULTS
from seer.scheduler.buffer import Request
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import InstanceLoad, PlacementConfig
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.index import PriorityIndex


class DividedFifo(Policy):
    name = "divided"
    config_keys = ("continuations_first",)

    def __init__(self, chunk_size: int | None = DEFAULTS.chunk_size, placement: PlacementConfig | None = None,
                 continuations_first: bool = DEFAULTS.continuations_first) -> None:
        super().__init__(chunk_size, placement)
        self.continuations_first = continuations_first
        self._ready = PriorityIndex()
        self._arrivals = 0

    def on_ready(self, req: Request) -> None:
        # continuations_first: the request's place is its arrival (`seq`); otherwise a request back
        # from a chunk joins the end of the queue
        self._ready.add(req, (req.seq if self.continuations_first else self._arrivals,))
        self._arrivals += 1

    def on_dispatched(self, decision: Dispatch) -> None:
        req = decision.request
        self._ready.discard(req)

    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        req = self._ready.peek()
        if req is None:
            return Wait("idle")
        return self.place(req, loads, "fifo")
