"""The contract every scheduling policy meets, and the dispatch step they share.

A policy is plain synchronous code over the request buffer's state: the dispatcher tells it
when a request becomes ready, is dispatched or finishes, and asks it for one decision at a time.
No I/O and no asyncio, so the async driver (seer.scheduler.driver) and a discrete-event
simulator (seer.sim) run the same code.

Writing one: subclass Policy, set `name`, implement on_ready, on_dispatched and pick (most
policies keep a PriorityIndex of ready requests and end pick with `self.place(req, loads,
reason)`), and give it to a run as `scheduler.policy: mypkg.sched:MyPolicy`, with
`scheduler.policy_args: {...}` for its constructor's own keywords. The config checks at load
time that the path names a Policy subclass and that its constructor takes those arguments.
DividedFifo (divided.py) is the shortest complete example; MoveEveryChunk (moving.py) one that
overrides placement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from seer.scheduler.config import DEFAULTS
from seer.scheduler.buffer import Request
from seer.scheduler.chunks import chunk_max_tokens
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import (
    InstanceLoad, PlacementConfig, choose_instance, kv_reservation, reservation_block_size,
)


class Policy(ABC):
    """One iteration's scheduling decisions: which ready request gets the next chunk, where, how long.

    Lifecycle (all calls come from one Dispatcher, on one thread, never concurrently):

    1. Constructed fresh for every rollout iteration (SchedulerConfig.build_policy), so state
       kept on the instance is per-iteration; nothing carries over between iterations.
    2. `on_ready` for every request of the iteration, in arrival order, before the first `pick`.
    3. Then, repeatedly: the driver calls `pick` until it returns a Wait; every Dispatch it
       returns is carried out at once (booked against the instance, sent to it) and reported
       back through `on_dispatched` before the next `pick`.
    4. As chunks end: `on_finished` when a request is done, else `on_ready` again (the request
       is back in the buffer with its new tokens, or after a failed chunk with the tokens it had).

    The dispatcher owns the buffer, the instance loads and the KV bookkeeping; a policy reads
    them and never changes them (no writes to a Request or an InstanceLoad).
    """

    name: ClassVar[str]  # recorded in the iteration's stats (metrics.jsonl "policy"); default: the class name
    # `scheduler.*` keys this policy's constructor takes as keywords of the same name (besides
    # chunk_size and placement, which every policy takes): build_policy passes their values.
    config_keys: ClassVar[tuple[str, ...]] = ()
    # Whether the constructor takes true output lengths as its first argument (the oracle, for
    # benchmarks only): the config refuses such a policy for training runs, and make_policy hands
    # lengths to no other policy.
    reads_true_lengths: ClassVar[bool] = False

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def __init__(self, chunk_size: int | None = DEFAULTS.chunk_size, placement: PlacementConfig | None = None) -> None:
        """`chunk_size`: `scheduler.chunk_size` (None: no chunking, a request runs to its end in one
        chunk); `placement`: the KV-budget and affinity settings `place` applies. A subclass takes
        both as keywords and passes them on; its other keywords come from `config_keys` and
        `scheduler.policy_args`."""
        if chunk_size is not None and chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive or None, got {chunk_size}")
        self.chunk_size = chunk_size
        self.placement = placement or PlacementConfig()

    @abstractmethod
    def on_ready(self, req: Request) -> None:
        """Called by the dispatcher when `req` waits for its next chunk: at the start of the
        iteration, after each of its chunks that did not finish it, and after a failed chunk.

        Record `req` as a candidate for `pick`. Its tokens so far (`req.generated`,
        `req.context_len`) and where its prefix is (`req.last_instance`) are current; do not
        modify it.
        """

    @abstractmethod
    def on_dispatched(self, decision: Dispatch) -> None:
        """Called by the dispatcher right after it carried out `decision`, the Dispatch this
        policy's last `pick` returned: the request is now in flight (no longer a candidate).

        Update the policy's own state here (remove the request from its queues, count the
        dispatch); this is the only place a dispatch changes it.
        """

    def on_finished(self, req: Request) -> None:
        """Called by the dispatcher when `req`'s last chunk ended (EOS or its length limit): its
        final length is now known. It will not be ready again this iteration. Optional."""

    @abstractmethod
    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        """Called by the driver whenever it can dispatch: after the ready requests were reported,
        and after each completion, repeatedly until it gets a Wait.

        Return a Dispatch for one ready request (usually through `place`, which sizes the chunk
        and checks the KV budget), or Wait("idle") when nothing is ready, or Wait("kv_full") when
        no instance can take the chosen request now. Must not change state: the same call twice
        gives the same decision; `on_dispatched` follows every Dispatch that is carried out.
        A Wait while no chunk is in flight ends the rollout with an error (nothing would wake
        it), so with nothing running, dispatch something: an idle instance admits any chunk.
        `loads` are the dispatcher's, current; read them, never write them.
        """

    def summary(self) -> dict:
        """Called once by the driver when the iteration's rollout ends: policy-specific numbers
        for the iteration's stats (RolloutResult.policy_summary). JSON-serialisable."""
        return {}

    def reserve_tokens(self, req: Request, max_tokens: int) -> int:
        """Called by `place`: how many of the next chunk's `max_tokens` its KV reservation covers.

        The whole chunk (the worst case) unless the policy knows better: then admission packs
        more requests into the same memory, and the engine, which allocates KV as tokens are
        generated, queues or preempts if a request outgrows what was reserved for it.
        """
        return max_tokens

    def engine_priority(self, req: Request) -> int:
        """Called by `place`: the priority the engine gives the next chunk of `req` (lower:
        scheduled first, preempted last).

        0 for every chunk unless the policy ranks them: then a full engine preempts the chunks the
        policy cares least about instead of the most recently admitted one.
        """
        return 0

    def place(self, req: Request, loads: Sequence[InstanceLoad], reason: str) -> Decision:
        """A helper for `pick`: size `req`'s next chunk and find it an instance within the KV
        budget (placement.choose_instance), or wait. `reason` is recorded with the chunk."""
        block = reservation_block_size(loads, self.placement)
        max_tokens = chunk_max_tokens(self.chunk_size, req.max_tokens, req.generated,
                                      context_len=req.context_len, block_size=block)
        reserve = max(1, min(max_tokens, self.reserve_tokens(req, max_tokens)))
        need = kv_reservation(req.context_len, reserve, self.placement, block)
        load = choose_instance(loads, need, req.last_instance, self.placement)
        if load is None:
            return Wait("kv_full")
        return Dispatch(req, load.name, max_tokens, need, reason, self.engine_priority(req))
