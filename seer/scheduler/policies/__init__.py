"""Scheduling policies, selectable by name (`scheduler.policy` in the config)."""

from __future__ import annotations

from collections.abc import Mapping

from seer.scheduler.placement import PlacementConfig
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.context import ContextAware
from seer.scheduler.policies.divided import DividedFifo
from seer.scheduler.policies.group_rr import GroupRoundRobin
from seer.scheduler.policies.oracle import LengthKey, OracleLongestFirst, true_lengths_from_samples

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (GroupRoundRobin, DividedFifo, ContextAware, OracleLongestFirst)
}


def make_policy(
    name: str,
    *,
    chunk_size: int | None = 8192,
    placement: PlacementConfig | None = None,
    true_lengths: Mapping[LengthKey, int] | None = None,
    **params,
) -> Policy:
    """Build a fresh policy (one per iteration: policies hold per-iteration state).

    `true_lengths` is accepted by `oracle_lfs` only: handing them to any other policy is an error,
    so a misconfigured benchmark cannot quietly give a real policy the answers.
    """
    if name not in POLICIES:
        raise ValueError(f"unknown scheduler policy {name!r}; choose one of {sorted(POLICIES)}")
    if name == OracleLongestFirst.name:
        if true_lengths is None:
            raise ValueError("oracle_lfs needs true_lengths from a previous run")
        return OracleLongestFirst(true_lengths, chunk_size=chunk_size, placement=placement, **params)
    if true_lengths is not None:
        raise ValueError(f"policy {name!r} may not read true lengths; only oracle_lfs does")
    return POLICIES[name](chunk_size=chunk_size, placement=placement, **params)


__all__ = [
    "POLICIES",
    "ContextAware",
    "DividedFifo",
    "GroupRoundRobin",
    "LengthKey",
    "OracleLongestFirst",
    "Policy",
    "make_policy",
    "true_lengths_from_samples",
]
