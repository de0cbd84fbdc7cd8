"""The `scheduler.*` settings of a run, and the policy they build.

Each setting's default is written once: here, or (for the placement keys) in PlacementConfig,
which this class reads it from. Policies, the dispatcher and the driver take theirs from
`DEFAULTS`, so a policy built by hand and one built from a run's config agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seer.scheduler.placement import PlacementConfig

if TYPE_CHECKING:  # the policies take their defaults from this module: imported where used
    from seer.scheduler.policies import LengthKey, Policy


@dataclass(frozen=True)
class SchedulerConfig:
    # A built-in's name (group_rr | divided | context | oracle_lfs: seer.scheduler.policies.BUILTIN)
    # or a `package.module:Class` path to a Policy subclass (policies/base.py says what it implements).
    policy: str = "context"
    # Keyword arguments for the policy's constructor beyond the `scheduler.*` keys it reads
    # (its `config_keys`, such as context's starvation_after); checked against its signature at load.
    policy_args: dict[str, Any] = field(default_factory=dict)
    chunk_size: int = 8192  # tokens per chunk (ignored by group_rr, which never chunks)
    # share of an instance's KV slots the scheduler may reserve
    kv_budget_fraction: float = PlacementConfig.kv_budget_fraction
    # KV block in tokens: reservations are whole blocks (instances' telemetry overrides it)
    block_size: int = PlacementConfig.block_size
    # a chunk leaves its prefix's instance only for this many more free KV tokens
    affinity_gap_tokens: int = PlacementConfig.affinity_gap_tokens
    affinity_gap_fraction: float = PlacementConfig.affinity_gap_fraction  # of the prefix instance's KV capacity; the larger gap applies
    max_running: int | None = None  # per instance; the only admission bound if KV capacity is unknown
    # a KV pool serves migrated prefixes (False: moving recomputes, so chunks stay; placement.py)
    kv_pool: bool = PlacementConfig.kv_pool
    kv_capacity_tokens: int | None = None  # overrides the capacity instances report
    starvation_after: int = 512  # context: dispatches a ready request may be passed over
    starvation_every: int = 16  # context: at most every n-th dispatch serves a starving request
    # context, divided: a started request's next chunk goes before new requests (divided: in arrival order)
    continuations_first: bool = False
    early_packing: bool = False  # context: reserve KV for what a chunk is expected to generate (policies/context.py)
    # context: chunks carry engine priorities (least progress = preempted first); the instances must run
    # vLLM's priority scheduling (`--scheduling-policy priority`: seer-run starts its instances so with this on)
    engine_priority: bool = False
    telemetry_interval_s: float = 0.5  # how often the driver reads every instance's /metrics
    max_chunk_retries: int = 3  # failed or aborted chunks of one request before the rollout fails
    # An instance with chunks in flight that answers nothing (no telemetry, no completed chunk) for
    # this long is dropped as hung; its chunks continue elsewhere.
    instance_timeout_s: float = 60.0

    @property
    def placement(self) -> PlacementConfig:
        return PlacementConfig(
            kv_budget_fraction=self.kv_budget_fraction,
            block_size=self.block_size,
            affinity_gap_tokens=self.affinity_gap_tokens,
            affinity_gap_fraction=self.affinity_gap_fraction,
            max_running=self.max_running,
            kv_pool=self.kv_pool,
        )

    def check_policy(self) -> type[Policy]:
        """The policy's class, once `policy` and `policy_args` are known to build it (config-load
        time: nothing is constructed); PolicyError naming the key otherwise."""
        from seer.scheduler.policies import PolicyError, check_policy

        cls = check_policy(self.policy, self.policy_args)
        unknown = [k for k in cls.config_keys if k not in self.__dataclass_fields__]
        if unknown:
            raise PolicyError(f"scheduler.policy {self.policy!r}: {cls.__qualname__}.config_keys names "
                              f"{', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not scheduler.* keys")
        return cls

    def build_policy(self, true_lengths: Mapping[LengthKey, int] | None = None) -> Policy:
        """A fresh policy for one iteration: chunk_size, placement, the `scheduler.*` keys the
        policy's class lists in `config_keys`, and `policy_args`."""
        from seer.scheduler.policies import make_policy, policy_class

        cls = policy_class(self.policy)
        settings = {k: getattr(self, k) for k in cls.config_keys}
        return make_policy(
            self.policy,
            chunk_size=self.chunk_size,
            placement=self.placement,
            true_lengths=true_lengths,
            **settings,
            **self.policy_args,
        )


# Every scheduler setting's default, for signatures outside this class (`= DEFAULTS.chunk_size`).
DEFAULTS = SchedulerConfig()
