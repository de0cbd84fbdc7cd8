"""The fleet: everything that runs on machines for a run, and its faults.

One object owns the vLLM instances, the global KV pool and the DGDS service of a run: it
launches them (or attaches to running instances), knows which instances are alive, drops a
lost one, restarts a lost KV master it launched, and loads a new weight version into every
instance and checks that each one serves it. The loop only asks it for live backends and hands
it weights; where the instances run (subprocesses here, actors on other machines) is the
fleet's business.

Every method is a coroutine of the run's one event loop, so HTTP sessions live as long as the run.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from seer.dgds.server.config import DGDSConfig
from seer.fleet.client import InstanceClient
from seer.fleet.config import InstancesConfig
from seer.fleet.instance import InstanceSpec
from seer.fleet.pool import InstancePool
from seer.fleet.weights import StaleWeightsError, push_weights, require_version, weight_version
from seer.kvpool.config import KVPoolConfig
from seer.procs import cpu_sets, cuda_devices, free_port, gpu_sets
from seer.types import WeightsRef


class FleetError(RuntimeError):
    """The fleet cannot go on (every instance lost, or a fault that is not an instance's loss)."""


@dataclass(frozen=True)
class LaunchSettings:
    """What every launched instance shares: the model and how vLLM runs it."""

    model_dir: str
    max_model_len: int
    dtype: str = "float32"
    seed: int = 0
    scheduling_policy: str = "fcfs"  # "priority" when the scheduler ranks its chunks (engine_priority)


@dataclass(frozen=True)
class Dropped:
    instance: str
    reason: str
    when: str


Notify = Callable[[str], None]


class Fleet:
    """Instances, KV pool and DGDS service of one run. Build with `Fleet.launch` or `Fleet.attach`;
    use as `async with`. `backends` are the live instances (seer.types.InstanceBackend)."""

    def __init__(self, pool: InstancePool, kv=None, dgds=None, notify: Notify | None = None):
        self.pool = pool
        self.kv = kv
        self.dgds = dgds
        self.notify = notify or (lambda msg: None)
        self.dropped: list[Dropped] = []

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    async def launch(
        cls,
        instances: InstancesConfig,
        kvpool: KVPoolConfig,
        dgds: DGDSConfig,
        launch: LaunchSettings,
        work_dir: str | Path,
        notify: Notify | None = None,
    ) -> Fleet:
        """Start the KV pool and the DGDS server, then the instances (which register with both),
        and wait until every instance answers; anything started is stopped if a later step fails."""
        from seer.dgds.server.service import DGDSService
        from seer.kvpool.pool import KVPool

        work = Path(work_dir)
        kv = await asyncio.to_thread(KVPool.start, kvpool, work / "kvpool")
        try:
            ds = await asyncio.to_thread(DGDSService.start, dgds, work / "dgds")
        except BaseException:
            kv.close()
            raise
        try:
            token = secrets.token_urlsafe(32)  # this run's: every instance route but /health needs it
            specs = [ds.configure(kv.configure(s)) for s in instance_specs(instances, launch, token)]
            pool = await InstancePool.alaunch(
                specs, work / "logs", instances.startup_timeout_s,
                on_ready=(lambda n, s: notify(f"  {n} ready in {s:.0f} s")) if notify else None,
            )
        except BaseException:
            ds.close()
            kv.close()
            raise
        return cls(pool, kv, ds, notify)

    @classmethod
    def attach(cls, urls: list[str], notify: Notify | None = None) -> Fleet:
        """Running instances reached by URL: they bring their own KV pool and drafting; this fleet
        starts nothing and stops nothing. Their secret, if they have one, is VLLM_API_KEY in this
        process's environment."""
        token = os.environ.get("VLLM_API_KEY") or None
        return cls(InstancePool.connect(list(urls), "seer-policy", token=token), None, None, notify)

    # ---- state ----------------------------------------------------------------------------
    @property
    def backends(self) -> list[InstanceClient]:
        return list(self.pool.clients)

    @property
    def names(self) -> list[str]:
        return self.pool.names

    @property
    def kv_pool_on(self) -> bool:
        return self.kv is not None and self.kv.enabled

    @property
    def launched(self) -> bool:
        return bool(self.pool.servers)

    # ---- faults ---------------------------------------------------------------------------
    def drop(self, name: str, reason: str, when: str) -> None:
        """Take a lost instance out for good; the run goes on with the others."""
        if name not in self.pool.names:
            return
        if len(self.pool.clients) <= 1:
            raise FleetError(f"every instance is lost ({when}): {name}: {reason}")
        self.pool.drop(name)
        self.dropped.append(Dropped(name, reason, when))
        self.notify(f"instance {name} dropped {when}: {reason}; continuing with {len(self.pool.clients)}: "
                    f"{', '.join(self.pool.names)}")

    async def drop_unhealthy(self, when: str) -> list[str]:
        """Drop every instance that does not answer /health; returns their names."""
        clients = self.backends
        ok = await asyncio.gather(*(c.healthy() for c in clients))
        dead = [c.name for c, alive in zip(clients, ok) if not alive]
        if dead and len(dead) == len(clients):
            raise FleetError(f"every instance is down ({when}): {', '.join(dead)}")
        for name in dead:
            self.drop(name, "not answering /health", when)
        return dead

    def absorb_rollout_drops(self, dropped: list[dict]) -> None:
        """Instances the scheduler dropped mid-rollout (their chunks finished elsewhere) leave too."""
        for d in dropped:
            self.drop(d["instance"], d["reason"], f"at +{d['t']:.1f} s of the rollout")

    async def revive_services(self, when: str) -> float | None:
        """Restart a KV master launched here that has exited (the store and the instances reconnect
        by themselves; the pool starts empty). Returns the seconds it took, or None."""
        if self.kv is None:
            return None
        took = await asyncio.to_thread(self.kv.ensure_master)
        if took is not None:
            self.notify(f"the Mooncake master had exited ({when}): restarted on "
                        f"{self.kv.endpoints.master_address} in {took:.1f} s; the pool starts empty")
        return took

    async def _on_live(self, when: str, work: Callable[[list[InstanceClient]], Awaitable[None]]) -> None:
        """Run `work(live clients)`; if it fails because instances died meanwhile (they no longer
        answer /health), drop them and run it again on the others. Any other failure is raised."""
        try:
            await work(self.backends)
        except Exception:
            if not await self.drop_unhealthy(when):
                raise
            await work(self.backends)

    # ---- an iteration's edges -------------------------------------------------------------
    async def prepare_rollout(self, version: int | None) -> None:
        """Before a rollout: drop dead instances, revive the KV master, and (when training) refuse
        to start while any live instance serves other weights than `version` (strictly on-policy)."""
        await self.drop_unhealthy("before the rollout")
        await self.revive_services("before the rollout")
        if version is not None:
            await self._on_live("before the rollout", lambda cs: require_version(cs, version))

    async def load_weights(self, ref: WeightsRef) -> float:
        """Load `ref` into every live instance, drop their prefix caches and the pool's (KV of old
        weights is never reused), and check each serves `ref.version`. Returns seconds."""
        t0 = time.monotonic()
        await self.revive_services("before the weight update")
        path = ref.local_path
        if path is None:
            raise FleetError(f"this fleet loads weights from local paths only, not {ref.uri!r}")

        async def push(clients):
            await push_weights(clients, path, ref.version, kv_pool=self.kv_pool_on)
            await require_version(clients, ref.version)

        await self._on_live("during the weight update", push)
        return time.monotonic() - t0

    async def versions(self) -> dict[str, int]:
        clients = self.backends
        return dict(zip([c.name for c in clients], await asyncio.gather(*(weight_version(c) for c in clients))))

    async def ensure_version(self, ref: WeightsRef) -> float | None:
        """Attached instances may serve another run's weights: load `ref` where they differ."""
        found = await self.versions()
        if all(v == ref.version for v in found.values()):
            return None
        return await self.load_weights(ref)

    # ---- shutdown -------------------------------------------------------------------------
    async def aclose(self) -> None:
        await self.pool.aclose_clients()
        self.close()

    def close(self) -> None:
        """Stop what this fleet launched: instances first, then DGDS and the pool."""
        self.pool.close()
        for service in (self.dgds, self.kv):
            if service is not None:
                service.close()

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def instance_specs(cfg: InstancesConfig, launch: LaunchSettings, token: str | None = None) -> list[InstanceSpec]:
    """One launch record per instance: on a GPU machine each gets its share of the GPUs, on CPU
    its share of the cores, so an idle instance is idle hardware as on a cluster."""
    gpus = cuda_devices()
    devices = ([(None, g) for g in gpu_sets(cfg.count, gpus)] if gpus
               else [(c, None) for c in cpu_sets(cfg.count)])
    return [
        InstanceSpec(
            name=f"inst{i}", model=launch.model_dir, port=free_port(), cpus=cpus, gpus=gpus_i,
            dtype=launch.dtype, max_model_len=launch.max_model_len, kv_cache_bytes=cfg.kv_cache_bytes,
            max_num_seqs=cfg.max_num_seqs, seed=launch.seed, extra_args=tuple(cfg.extra_args),
            scheduling_policy=launch.scheduling_policy, token=token,
        )
        for i, (cpus, gpus_i) in enumerate(devices)
    ]


__all__ = ["Dropped", "Fleet", "FleetError", "LaunchSettings", "StaleWeightsError", "instance_specs"]
