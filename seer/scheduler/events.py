"""Records the dispatcher emits: one per chunk, and progress snapshots."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkEvent:
    """One chunk's life: where it ran, when, what it produced, and whether it moved."""

    request_id: str
    chunk_id: str
    group_id: int
    sample_index: int
    chunk_index: int
    instance: str
    reason: str  # the policy rule that chose it
    max_tokens: int
    kv_tokens: int  # KV reserved for it
    prompt_tokens: int
    cached_prefix_tokens: int  # prompt tokens the instance did not recompute (local cache or pool)
    new_tokens: int
    finish_reason: str  # the engine's ("stop", "length", "abort"), or "error"
    migrated: bool  # ran on another instance than the request's previous chunk
    dispatch_time: float  # scheduler clock
    complete_time: float  # scheduler clock
    engine_start_time: float  # the engine's own timestamps (its clock)
    engine_finish_time: float
    request_finished: bool
    turn: int = 0  # multi-turn: the request's turns ended before this chunk (its chunks of turn k+1 have k)

    @property
    def recomputed_prefix_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prefix_tokens


@dataclass(frozen=True)
class EnvWait:
    """Multi-turn: one stretch a trajectory waited for its environment (a tool call, or its reset), holding
    no instance slot. `instance` ran its last turn (None before its first): under session-sticky
    routing the engine its next turn must come back to."""

    request_id: str
    group_id: int
    sample_index: int
    turn: int  # the model turns it had ended (0: before its first turn)
    instance: str | None
    dispatch_time: float  # scheduler clock, as a chunk's: when the wait began
    complete_time: float  # when the environment's answer was fed back


@dataclass(frozen=True)
class Progress:
    finished: int
    total: int
    running_chunks: int
    output_tokens: int
    elapsed_s: float
    queued: int = 0  # requests waiting for their next chunk
    migrated: int = 0  # chunks so far that ran on another instance than their request's previous chunk
    instances: tuple[tuple[str, float, int], ...] = ()  # (name, KV usage, our chunks running there)
