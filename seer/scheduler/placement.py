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
    block_size: int = 16  # KV is allocated in blocks; reserve whole blocks (instances' telemetry overrides it)
    # Stay on the prefix's instance unless another has more free KV by this many tokens, or by this
    # share of the prefix instance's capacity, whichever is larger (see choose_instance).
    affinity_gap_tokens: int = 512
    affinity_gap_fraction: float = 0.25
    max_running: int | None = None  # optional cap per instance (the only bound when capacity is unknown)
    # Whether a chunk that changes instance loads its prefix from a global KV pool. Without one it
    # recomputes the whole prefix (as much compute as generating it again), so a chunk waits for
    # the instance holding its prefix instead of moving, unless another instance is idle.
    kv_pool: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.kv_budget_fraction <= 1:
            raise ValueError("kv_budget_fraction must be in (0, 1]")
        if self.block_size <= 0 or self.affinity_gap_tokens < 0:
            raise ValueError("block_size must be > 0 and affinity_gap_tokens >= 0")
        if not 0 <= self.affinity_gap_fraction <= 1:
            raise ValueError("affinity_gap_fraction must be in [0, 1]")
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
    block_size: int = 0  # tokens per KV block the instance reports; 0 = unknown (config's block_size)


def reservation_block_size(loads: Sequence[InstanceLoad], cfg: PlacementConfig) -> int:
    """The block size reservations are rounded to: the largest any instance reports, else the config's.

    vLLM allocates KV in whole blocks (128 tokens on its CPU backend, 16 on GPUs); reserving in
    smaller units undercounts every request by up to a block, and the engine then preempts.
    """
    return max((load.block_size for load in loads if load.block_size > 0), default=cfg.block_size)


def kv_reservation(context_len: int, max_tokens: int, cfg: PlacementConfig, block_size: int | None = None) -> int:
    """KV slots a chunk can occupy by its end, rounded up to whole blocks.

    A chunk that starts at `context_len` and samples `max_tokens` tokens computes KV for
    `context_len + max_tokens - 1` positions: the last sampled token is returned, never fed back.
    (vLLM's CPU backend schedules synchronously; a GPU engine with async scheduling may allocate
    one more slot in a request's last step, which `kv_budget_fraction` leaves room for.)
    """
    bs = block_size or cfg.block_size
    return math.ceil((context_len + max_tokens - 1) / bs) * bs


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


def affinity_gap(home: InstanceLoad, cfg: PlacementConfig) -> float:
    """How much more free KV another instance needs before a chunk leaves its prefix's instance."""
    return max(cfg.affinity_gap_tokens, cfg.affinity_gap_fraction * home.capacity_tokens)


def choose_instance(
    loads: Sequence[InstanceLoad],
    need: int,
    prefix_instance: str | None,
    cfg: PlacementConfig,
) -> InstanceLoad | None:
    """The admitting instance with the most free KV, or the prefix's instance if it is close.

    Staying where the prefix is costs nothing (its blocks are in the instance's prefix cache);
    moving costs a pool transfer, or a full re-prefill without the pool. So a chunk whose prefix
    instance admits it stays there unless another instance has more free KV by the affinity gap
    (`affinity_gap`: `affinity_gap_tokens`, or `affinity_gap_fraction` of the capacity if larger),
    or is idle while the prefix instance still has other work. Smaller imbalances are evened out
    by placing new requests, which have no prefix anywhere, on the freer instance.

    Without a KV pool (`cfg.kv_pool` False) a move recomputes the whole prefix on the new instance,
    so a chunk stays with its prefix whatever the gap, and when the prefix instance has no room
    it waits for it (chunks there end and free KV) rather than move, unless another instance is
    idle, whose spare compute the recompute costs nothing. A prefix instance that is down does
    not hold the chunk back.
    None means no instance can take the chunk now: wait.
    """
    best: InstanceLoad | None = None
    prefix_load: InstanceLoad | None = None  # the prefix's instance, admitting or not
    home: InstanceLoad | None = None  # the prefix's instance if it admits the chunk
    for load in loads:
        if load.name == prefix_instance:
            prefix_load = load
        if not admits(load, need, cfg):
            continue
        if best is None or _rank(load, cfg) > _rank(best, cfg):
            best = load
        if load is prefix_load:
            home = load
    if best is None or home is best:
        return best
    if home is None:  # the prefix instance cannot take it now (or there is no prefix yet)
        if cfg.kv_pool or best.running == 0 or prefix_load is None or prefix_load.down is not None:
            return best
        return None
    if best.running == 0 and home.running > 0:  # an idle instance takes work from a busy one
        return best
    if not cfg.kv_pool:
        return home
    gap = free_tokens(best, cfg) - free_tokens(home, cfg)
    if math.isnan(gap) or gap <= affinity_gap(home, cfg):  # nan: both unknown, i.e. no evidence of a gap
        return home
    return best
