"""The baseline Seer is measured against (veRL-style): whole groups, round-robin, no chunking.

Every request runs to completion on its group's instance and admission is unbounded (the
engine queues and preempts), which is exactly what produces the long tail.
"""

from __future__ import annotations

from collections.abc import Sequence

from seer.scheduler.buffer import Request
from seer.scheduler.chunks import chunk_max_tokens
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import InstanceLoad, PlacementConfig, kv_reservation, reservation_block_size
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.index import PriorityIndex


class GroupRoundRobin(Policy):
    name = "group_rr"

    def __init__(self, chunk_size: int | None = None, placement: PlacementConfig | None = None) -> None:
        # chunk_size is accepted for a uniform constructor and ignored: the baseline never chunks.
        super().__init__(None, placement)
        self._ready = PriorityIndex()
        self._instance_of_group: dict[int, str] = {}
        self._groups_assigned = 0

    def on_ready(self, req: Request) -> None:
        self._ready.add(req, ())

    def on_dispatched(self, decision: Dispatch) -> None:
        req = decision.request
        self._ready.discard(req)
        if self._instance_of_group.get(req.group_id) != decision.instance:
            self._instance_of_group[req.group_id] = decision.instance
            self._groups_assigned += 1

    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        req = self._ready.peek()
        if req is None:
            return Wait("idle")
        live = [load for load in loads if load.down is None]
        if not live:
            return Wait("kv_full")
        instance = self._instance_of_group.get(req.group_id)
        if instance is None or instance not in {load.name for load in live}:
            # a new group, or one whose instance was dropped, takes the next live instance in turn
            instance = live[self._groups_assigned % len(live)].name
        max_tokens = chunk_max_tokens(None, req.max_tokens, req.generated)
        need = kv_reservation(req.context_len, max_tokens, self.placement, reservation_block_size(loads, self.placement))
        return Dispatch(req, instance, max_tokens, need, "round_robin")

    def summary(self) -> dict:
        return {"groups_assigned": self._groups_assigned}
