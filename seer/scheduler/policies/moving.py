"""A test and benchmark policy: every chunk of a request runs on a different instance than the last.

Not for training runs (it throws away the prefix cache on purpose). It exists to exercise the
global KV pool deterministically: with it every continuation chunk is a migration, so a test of
pool transfers, or a benchmark of what a migration costs, does not depend on a schedule
happening to move one. Use it by path:

    scheduler.policy: seer.scheduler.policies.moving:MoveEveryChunk

Order is DividedFifo's (first come first served; a request back from a chunk joins the end of
the queue, or keeps its place with `scheduler.continuations_first`). Placement is the usual
KV-budget check over every live instance except the one that ran the request's last chunk;
with a single live instance there is nowhere to move and the chunk stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from seer.scheduler.config import DEFAULTS
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import InstanceLoad, PlacementConfig
from seer.scheduler.policies.divided import DividedFifo


class MoveEveryChunk(DividedFifo):
    name = "move_every_chunk"

    def __init__(self, chunk_size: int | None = DEFAULTS.chunk_size, placement: PlacementConfig | None = None,
                 continuations_first: bool = DEFAULTS.continuations_first) -> None:
        super().__init__(chunk_size, placement, continuations_first)
        self._moves = 0

    def on_dispatched(self, decision: Dispatch) -> None:
        super().on_dispatched(decision)
        req = decision.request  # the dispatcher has recorded the new chunk's instance already
        if req.chunks > 1 and req.instances[-2] != decision.instance:
            self._moves += 1

    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        req = self._ready.peek()
        if req is None:
            return Wait("idle")
        elsewhere = [load for load in loads if load.down is None and load.name != req.last_instance]
        if req.last_instance is None or not elsewhere:
            return self.place(req, loads, "fifo")
        # Placed among the other instances only: the prefix's instance is not a candidate, so there
        # is no affinity, and the chunk waits for room elsewhere rather than stay.
        return self.place(req, elsewhere, "move")

    def summary(self) -> dict:
        return {"moves": self._moves}
