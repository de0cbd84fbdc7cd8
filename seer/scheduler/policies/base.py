"""The contract every scheduling policy meets, and the dispatch step they share.

A policy is plain synchronous code over the request buffer's state: the dispatcher tells it
when a request becomes ready, is dispatched or finishes, and asks it for one decision at a time.
No I/O and no asyncio, so the async driver and a discrete-event simulator run the same code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from seer.scheduler.buffer import Request
from seer.scheduler.chunks import chunk_max_tokens
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import (
    InstanceLoad, PlacementConfig, choose_instance, kv_reservation, reservation_block_size,
)


class Policy(ABC):
    name: ClassVar[str]

    def __init__(self, chunk_size: int | None = 8192, placement: PlacementConfig | None = None) -> None:
        if chunk_size is not None and chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive or None, got {chunk_size}")
        self.chunk_size = chunk_size
        self.placement = placement or PlacementConfig()

    @abstractmethod
    def on_ready(self, req: Request) -> None:
        """`req` waits for its next chunk: new, or back after a non-final chunk or a failure."""

    @abstractmethod
    def on_dispatched(self, decision: Dispatch) -> None:
        """`decision` (this policy's last pick) was carried out: its request is in flight."""

    def on_finished(self, req: Request) -> None:
        """`req` reached EOS or its length limit (its length is now known to the system)."""

    @abstractmethod
    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        """The next decision; must not change state (on_dispatched does that)."""

    def summary(self) -> dict:
        """Policy-specific numbers for the iteration's stats."""
        return {}

    def reserve_tokens(self, req: Request, max_tokens: int) -> int:
        """How many of the next chunk's `max_tokens` its KV reservation covers.

        The whole chunk (the worst case) unless the policy knows better: then admission packs
        more requests into the same memory, and the engine, which allocates KV as tokens are
        generated, queues or preempts if a request outgrows what was reserved for it.
        """
        return max_tokens

    def engine_priority(self, req: Request) -> int:
        """The priority the engine gives the next chunk of `req` (lower: scheduled first, preempted last).

        0 for every chunk unless the policy ranks them: then a full engine preempts the chunks the
        policy cares least about instead of the most recently admitted one.
        """
        return 0

    def place(self, req: Request, loads: Sequence[InstanceLoad], reason: str) -> Decision:
        """Size `req`'s next chunk and find it an instance within the KV budget, or wait."""
        block = reservation_block_size(loads, self.placement)
        max_tokens = chunk_max_tokens(self.chunk_size, req.max_tokens, req.generated,
                                      context_len=req.context_len, block_size=block)
        reserve = max(1, min(max_tokens, self.reserve_tokens(req, max_tokens)))
        need = kv_reservation(req.context_len, reserve, self.placement, block)
        load = choose_instance(loads, need, req.last_instance, self.placement)
        if load is None:
            return Wait("kv_full")
        return Dispatch(req, load.name, max_tokens, need, reason, self.engine_priority(req))
