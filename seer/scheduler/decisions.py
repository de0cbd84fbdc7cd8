"""What a policy returns on each call: dispatch one chunk, or wait for a completion."""

from __future__ import annotations

from dataclasses import dataclass

from seer.scheduler.buffer import Request


@dataclass(frozen=True)
class Dispatch:
    """Send the next chunk of `request` (at most `max_tokens`) to `instance`."""

    request: Request
    instance: str
    max_tokens: int
    kv_tokens: int  # the reservation admission was checked against; the dispatcher books exactly this
    reason: str  # which rule chose it ("probe", "longest", "starvation", "fifo", "round_robin", "oracle")
    # The engine's priority for the chunk (vLLM's convention: lower is scheduled first and preempted
    # last); 0 for all unless the policy ranks chunks for the engine (Policy.engine_priority).
    priority: int = 0


@dataclass(frozen=True)
class Wait:
    """Nothing to dispatch until a chunk completes: nothing ready, or no instance has room."""

    reason: str  # "idle" or "kv_full"


Decision = Dispatch | Wait
