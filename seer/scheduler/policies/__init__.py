"""Scheduling policies: the built-ins by name, any Policy subclass by `module:Class` path.

`scheduler.policy` in the config is one of BUILTIN's names or a path such as
`mypkg.sched:MyPolicy`; `scheduler.policy_args` are keyword arguments for its constructor.
Adding a built-in policy is adding its class to BUILTIN: the config's check, the policy's
construction and its settings (the `scheduler.*` keys it declares in `config_keys`) follow
from the class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seer.plugins import PluginError, check_arguments, is_path, resolve
from seer.scheduler.config import DEFAULTS
from seer.scheduler.placement import PlacementConfig
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.context import ContextAware
from seer.scheduler.policies.divided import DividedFifo
from seer.scheduler.policies.group_rr import GroupRoundRobin
from seer.scheduler.policies.moving import MoveEveryChunk
from seer.scheduler.policies.oracle import LengthKey, OracleLongestFirst, true_lengths_from_samples

BUILTIN: tuple[type[Policy], ...] = (GroupRoundRobin, DividedFifo, ContextAware, OracleLongestFirst)
POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in BUILTIN}


class PolicyError(PluginError):
    """A `scheduler.policy` / `scheduler.policy_args` that cannot build a policy; names the key."""


def _is_policy_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, Policy)


def policy_class(spec: str) -> type[Policy]:
    """The class `scheduler.policy` names: a built-in's name or a `module:Class` path."""
    if spec in POLICIES:
        return POLICIES[spec]
    if is_path(spec):
        return resolve(spec, key="scheduler.policy", kind=_is_policy_class,
                       kind_name="subclass of seer.scheduler.policies.base.Policy", error=PolicyError)
    raise PolicyError(f"unknown scheduler policy {spec!r}: scheduler.policy is one of {', '.join(POLICIES)} "
                      "or a 'package.module:Class' path to a Policy subclass")


def check_policy(spec: str, args: Mapping[str, Any] = {}) -> type[Policy]:
    """Resolve `spec` and check that its constructor takes `args` (config-load time; no instance built)."""
    cls = policy_class(spec)
    seer_sets = {"chunk_size": None, "placement": None, **{k: None for k in cls.config_keys}}
    if cls.reads_true_lengths:
        seer_sets["true_lengths"] = None
    clash = sorted(set(args) & {"chunk_size", *cls.config_keys})
    if clash:
        one = len(clash) == 1
        raise PolicyError(f"scheduler.policy_args: {', '.join(clash)} {'comes' if one else 'come'} from the "
                          f"scheduler.* key{'' if one else 's'} of the same name: set "
                          f"{', '.join('scheduler.' + k for k in clash)} instead")
    try:
        check_arguments(cls, args, key="scheduler.policy_args", given=seer_sets, fn_key="scheduler.policy")
    except PluginError as e:
        raise PolicyError(str(e)) from None
    return cls


def make_policy(
    name: str,
    *,
    chunk_size: int | None = DEFAULTS.chunk_size,
    placement: PlacementConfig | None = None,
    true_lengths: Mapping[LengthKey, int] | None = None,
    **params,
) -> Policy:
    """Build a fresh policy (one per iteration: policies hold per-iteration state).

    `name`: a built-in's name or a `module:Class` path. `true_lengths` are accepted by a policy
    whose class says it reads them (`reads_true_lengths`, the oracle) only: handing them to any
    other policy is an error, so a misconfigured benchmark cannot quietly give a real policy the
    answers.
    """
    cls = policy_class(name)
    if cls.reads_true_lengths:
        if true_lengths is None:
            raise ValueError(f"{cls.name} needs true_lengths from a previous run")
        return cls(true_lengths, chunk_size=chunk_size, placement=placement, **params)
    if true_lengths is not None:
        raise ValueError(f"policy {cls.name!r} may not read true lengths; only oracle_lfs does")
    return cls(chunk_size=chunk_size, placement=placement, **params)


__all__ = [
    "BUILTIN",
    "POLICIES",
    "ContextAware",
    "DividedFifo",
    "GroupRoundRobin",
    "LengthKey",
    "MoveEveryChunk",
    "OracleLongestFirst",
    "Policy",
    "PolicyError",
    "check_policy",
    "make_policy",
    "policy_class",
    "true_lengths_from_samples",
]
