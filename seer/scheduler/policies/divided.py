"""Divided rollout without length context: request-level chunks, first come first served.

The ablation step between the baseline and Seer: it gains load balance and KV-bounded
admission from chunking, but orders work by arrival only.
"""

from __future__ import annotations

from collections.abc import Sequence

from seer.scheduler.buffer import Request
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import InstanceLoad, PlacementConfig
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.index import PriorityIndex


class DividedFifo(Policy):
    name = "divided"

    def __init__(self, chunk_size: int | None = 8192, placement: PlacementConfig | None = None) -> None:
        super().__init__(chunk_size, placement)
        self._ready = PriorityIndex()
        self._arrivals = 0  # a request back from a chunk joins the end of the queue

    def on_ready(self, req: Request) -> None:
        self._ready.add(req, (self._arrivals,))
        self._arrivals += 1

    def on_dispatched(self, decision: Dispatch) -> None:
        req = decision.request
        self._ready.discard(req)

    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        req = self._ready.peek()
        if req is None:
            return Wait("idle")
        return self.place(req, loads, "fifo")
