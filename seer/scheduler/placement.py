"""Which instance a chunk goes to, and whether it may go at all.

Admission is bounded by a KV budget per instance: a chunk reserves the KV it can reach at its
end (context so far + chunk max_tokens), so the sum of reservations on an instance never
exceeds what it holds and vLLM never has to preempt a long request. The scheduler counts its
own reservations rather than trusting telemetry for admission, because telemetry lags by a
poll interval and cannot see the chunk dispatched a millisecond ago; telemetry supplies the
capacity and the observed usage that breaks ties.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PlacementConfig:
    kv_budget_fraction: float = 0.95  # share of an instance's KV slots the scheduler may reserve
    block_size: int = 16  # KV is allocated in blocks; reserve whole blocks
    affinity_gap_tokens: int = 512  # stay on the prefix's instance unless another has this much more free KV
    max_running: int | None = None  # optional cap per instance (the only bound when capacity is unknown)

    def __post_init__(self) -> None:
        if not 0 < self.kv_budget_fraction <= 1:
            raise ValueError("kv_budget_fraction must be in (0, 1]")
        if self.block_size <= 0 or self.affinity_gap_tokens < 0:
            raise ValueError("block_size must be > 0 and affinity_gap_tokens >= 0")
        if self.max_running is not None and self.max_running <= 0:
            raise ValueError("max_running must be positive")


@dataclass
class InstanceLoad:
    """What the scheduler knows about one instance's memory at decision time."""

    name: str
    index: int  # position in the instance list: the final, stable tie-break
    capacity_tokens: int = 0  # KV slots; 0 = unknown, so only max_running bounds admission
    reserved_tokens: int = 0  # sum of the reservations of our chunks in flight there
    running: int = 0  # our chunks in flight there
    kv_usage: float = 0.0  # last telemetry (0..1)
    preemptions_total: int = 0  # last telemetry
    down: str | None = None  # why the instance was dropped (dead or hung); None while it serves


def kv_reservation(context_len: int, max_tokens: int, cfg: PlacementConfig) -> int:
    """KV slots a chunk can occupy by its end, rounded up to whole blocks."""
    return math.ceil((context_len + max_tokens) / cfg.block_size) * cfg.block_size


def free_tokens(load: InstanceLoad, cfg: PlacementConfig) -> float:
    """Budget left after our reservations; infinite when the capacity is unknown."""
    if load.capacity_tokens <= 0:
        return math.inf
    return int(load.capacity_tokens * cfg.kv_budget_fraction) - load.reserved_tokens


def admits(load: InstanceLoad, need: int, cfg: PlacementConfig) -> bool:
    """Whether `load` can take a chunk reserving `need` slots.

    An idle instance takes anything, so a request larger than a whole budget still runs
    (alone) instead of blocking the iteration forever.
    """
    if load.down is not None:
        return False
    if load.running == 0:
        return True
    if cfg.max_running is not None and load.running >= cfg.max_running:
        return False
    return need <= free_tokens(load, cfg)


def _rank(load: InstanceLoad, cfg: PlacementConfig) -> tuple:
    return (free_tokens(load, cfg), -load.running, -load.kv_usage, -load.index)


def choose_instance(
    loads: Sequence[InstanceLoad],
    need: int,
    prefix_instance: str | None,
    cfg: PlacementConfig,
) -> InstanceLoad | None:
    """The admitting instance with the most free KV, or the prefix's instance if it is close.

    Staying where the prefix is avoids a pool transfer; past `affinity_gap_tokens` of extra free
    KV elsewhere, balance wins and the next instance pulls the prefix from the pool.
    None means no instance can take the chunk now: wait.
    """
    best: InstanceLoad | None = None
    home: InstanceLoad | None = None
    for load in loads:
        if not admits(load, need, cfg):
            continue
        if best is None or _rank(load, cfg) > _rank(best, cfg):
            best = load
        if load.name == prefix_instance:
            home = load
    if best is None or home is None or home is best:
        return best
    gap = free_tokens(best, cfg) - free_tokens(home, cfg)
    if math.isnan(gap) or gap <= cfg.affinity_gap_tokens:  # nan: both unknown, i.e. no evidence of a gap
        return home
    return best
