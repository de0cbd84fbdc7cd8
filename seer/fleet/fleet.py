"""The fleet: everything that runs on machines for a run, and its faults.

One object owns the vLLM instances, the global KV pool and the DGDS service of a run: it
launches them (or attaches to running instances) on the run's Ray, knows which instances are
alive, drops a lost one and restarts a lost KV master it launched. New weight versions reach the
instances through its `weights` (seer.fleet.push), which asks it for the live instances and
hands it the ones to drop. The loop only asks it for live backends and pushes weights; where the
instances run (subprocesses here, actors on other machines) is the fleet's business.

Every method is a coroutine of the run's one event loop, so HTTP sessions live as long as the run.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from seer.dgds.server.config import DGDSConfig
from seer.fleet.client import HEALTH_RECHECK_S, InstanceClient
from seer.fleet.config import ClusterConfig, InstancesConfig
from seer.fleet.instance import InstanceSpec
from seer.fleet.pool import InstancePool
from seer.fleet.push import WeightPush
from seer.fleet.weights import StaleWeightsError, require_version, weight_version
from seer.kvpool.config import KVPoolConfig
from seer.types import InstanceDrop

if TYPE_CHECKING:
    from seer.fleet.ray_cluster import RayCluster


LOOPBACK = "127.0.0.1"


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

    def __init__(self, pool: InstancePool, kv=None, dgds=None, notify: Notify | None = None,
                 placement=None, cluster=None, cluster_cfg: ClusterConfig | None = None,
                 driver_node: str | None = None, owns_cluster: bool = False):
        self.pool = pool
        self.kv = kv
        self.dgds = dgds
        self.notify = notify or (lambda msg: None)
        self.dropped: list[Dropped] = []
        self.placement = placement  # seer.fleet.ray_hosts.Placement of launched instances
        self.cluster = cluster  # seer.fleet.ray_cluster.RayCluster: the run's Ray, where the instances run
        self.cluster_cfg = cluster_cfg or ClusterConfig()
        self.driver_node = driver_node  # the Ray node id of this driver
        self.owns_cluster = owns_cluster  # close `cluster` with the fleet (it connected to Ray itself)
        self.weights = WeightPush(self)  # new versions into every instance (seer.fleet.push)

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
        cluster: ClusterConfig | None = None,
        ray: RayCluster | None = None,
    ) -> Fleet:
        """Place one Ray actor per instance on `ray`, the run's Ray connection (the job's; without
        one the fleet connects as `cluster` says, a one-node Ray started here unless it names one,
        and closes it with itself), start the KV master and the DGDS server on this node and a KV
        store on every node that hosts instances, then the instances (which register with both) on
        their nodes, and wait until every instance answers; anything started is stopped if a later
        step fails."""
        from seer.dgds.server.service import DGDSService
        from seer.fleet.ray_cluster import RayCluster
        from seer.kvpool.pool import KVPool

        work = Path(work_dir)
        cfg = cluster or ClusterConfig()
        owns = ray is None
        # Before ray is imported: it reads its auth settings then.
        ray_cluster = RayCluster.connect(cfg, work / "logs") if owns else ray
        from seer.fleet.ray_hosts import Placement, RemoteServer
        started: list = [ray_cluster] if owns else []
        try:
            say = notify or (lambda msg: None)
            if owns and ray_cluster.started_here:
                say(f"  a one-node Ray on {ray_cluster.node_ip} in {ray_cluster.startup_s:.1f} s")
            placement = await asyncio.to_thread(Placement.create, instances.count, cfg)
            started.append(placement)
            nodes = placement.distinct_nodes()
            say(f"  {instances.count} instances placed ({cfg.placement_strategy}) on {len(nodes)} node(s): "
                + ", ".join(n.ip for n in nodes))
            # Services of the driver's node bind to its cluster address unless the config names one.
            kvpool = replace(kvpool, host=ray_cluster.node_ip) if kvpool.host == LOOPBACK else kvpool
            dgds = replace(dgds, host=ray_cluster.node_ip) if dgds.host == LOOPBACK else dgds
            kv = await asyncio.to_thread(KVPool.start, kvpool, work / "kvpool", False)
            started.append(kv)
            if kv.enabled and kvpool.capacity_bytes > 0:
                for store in await asyncio.to_thread(placement.start_stores, kvpool, kv.endpoints, str(work)):
                    await asyncio.to_thread(kv.add_store, store)
            ds = await asyncio.to_thread(DGDSService.start, dgds, work / "dgds")
            started.append(ds)
            token = secrets.token_urlsafe(32)  # this run's: every instance route but /health needs it
            kv_arg = (kvpool, kv.endpoints) if kv.enabled else None
            servers = [
                RemoteServer(ds.configure(spec), actor, node, cpus, kv_arg, str(work))
                for spec, actor, node, cpus in zip(
                    [base_spec(i, instances, launch, token) for i in range(instances.count)],
                    placement.actors, placement.nodes, placement.core_sets())
            ]
            pool = await InstancePool.astart(
                servers, instances.startup_timeout_s,
                on_ready=(lambda n, s: say(f"  {n} ready in {s:.0f} s")) if notify else None,
            )
            for srv in pool.servers:
                say(f"  {srv.spec.name} on node {srv.node.ip} (Ray node {srv.node.node_id}): {srv.spec.url}, "
                    + (f"GPUs {srv.spec.gpus}" if srv.spec.gpus else f"cores {srv.spec.cpus}"))
            if kv.stores:
                say(f"  KV pool: master on {kv.endpoints.master_address}, a store of "
                    f"{kvpool.capacity_bytes >> 20} MiB on each node: {', '.join(s.node.ip for s in kv.stores)}")
        except BaseException:
            for part in reversed(started):
                part.close()
            raise
        from seer.fleet.ray_hosts import driver_node_id

        return cls(pool, kv, ds, notify, placement, ray_cluster, cfg, driver_node_id(), owns)

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

    def live_servers(self) -> list:
        live = set(self.pool.names)
        return [s for s in self.pool.servers if s.spec.name in live]

    # ---- faults ---------------------------------------------------------------------------
    def nodes(self) -> dict[str, str]:
        """Each live launched instance's node address (empty for attached instances)."""
        return {s.spec.name: s.node.ip for s in self.live_servers() if getattr(s, "node", None) is not None}

    def where(self, name: str) -> str | None:
        """The node of a launched instance, and whether Ray still counts it alive."""
        server = next((s for s in self.pool.servers if s.spec.name == name), None)  # None: attached
        node = getattr(server, "node", None)
        if node is None:
            return None
        from seer.fleet.ray_hosts import node_alive

        state = {True: "alive", False: "dead", None: "unknown"}[node_alive(node.node_id)]
        return f"node {node.ip} ({node.node_id[:12]}, Ray: {state})"

    def drop(self, name: str, reason: str, when: str) -> None:
        """Take a lost instance out for good; the run goes on with the others."""
        if name not in self.pool.names:
            return
        where = self.where(name)
        if where:
            reason = f"{reason}; on {where}"
        if len(self.pool.clients) <= 1:
            raise FleetError(f"every instance is lost ({when}): {name}: {reason}")
        self.pool.drop(name)
        self.dropped.append(Dropped(name, reason, when))
        self.notify(f"instance {name} dropped {when}: {reason}; continuing with {len(self.pool.clients)}: "
                    f"{', '.join(self.pool.names)}")

    async def drop_unhealthy(self, when: str) -> list[str]:
        """Drop every instance that does not answer /health; returns their names. One that did not
        answer in time is asked once more with a longer wait: on a loaded machine a live server's
        /health can take seconds, and dropping it would lose an instance (or the run) for nothing."""
        clients = self.backends
        ok = list(await asyncio.gather(*(c.healthy() for c in clients)))
        slow = [i for i, alive in enumerate(ok) if not alive]
        again = await asyncio.gather(*(clients[i].healthy(HEALTH_RECHECK_S) for i in slow))
        for i, alive in zip(slow, again):
            ok[i] = alive
        dead = [c.name for c, alive in zip(clients, ok) if not alive]
        if dead and len(dead) == len(clients):
            raise FleetError(f"every instance is down ({when}): {', '.join(dead)}")
        for name in dead:
            self.drop(name, "not answering /health", when)
        return dead

    def absorb_rollout_drops(self, dropped: Sequence[InstanceDrop]) -> None:
        """Instances the rollout dropped mid-run (`RolloutBatch.dropped`; their chunks finished
        elsewhere) leave the fleet too."""
        for d in dropped:
            self.drop(d.instance, d.reason, f"at +{d.at_s:.1f} s of the rollout")

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

    async def on_live(self, when: str, work: Callable[[list[InstanceClient]], Awaitable[None]]) -> None:
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
            await self.on_live("before the rollout", lambda cs: require_version(cs, version))

    async def enable_routing(self) -> None:
        """Routing replay: turn on every live instance's routing capture (seer.fleet.routing_ext);
        each chunk's routing then comes back with its result. A dense model is refused there."""
        headers = await asyncio.gather(*(c.enable_routing() for c in self.backends))
        if len({(h["layers"], h["top_k"], h["dtype"]) for h in headers}) != 1:
            raise FleetError(f"instances capture different routing layouts: {headers}")
        h = headers[0]
        self.notify(f"  routing capture on: {h['layers']} MoE layers x top-{h['top_k']} of {h['num_experts']} "
                    f"experts ({h['dtype']}), {h['layers'] * h['top_k'] * (1 if h['dtype'] == 'uint8' else 2)} B per token")

    async def versions(self) -> dict[str, int]:
        clients = self.backends
        return dict(zip([c.name for c in clients], await asyncio.gather(*(weight_version(c) for c in clients))))

    # ---- shutdown -------------------------------------------------------------------------
    async def aclose(self) -> None:
        await self.pool.aclose_clients()
        self.close()

    def close(self) -> None:
        """Stop what this fleet launched: the weights delivered to each node, the instances, then
        DGDS and the pool, then Ray if the fleet connected to it itself (the job's Ray is the job's)."""
        self.weights.close()
        self.pool.close()
        for service in (self.dgds, self.kv, self.placement, self.cluster if self.owns_cluster else None):
            if service is not None:
                service.close()

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def base_spec(i: int, cfg: InstancesConfig, launch: LaunchSettings, token: str | None = None) -> InstanceSpec:
    """Instance `i`'s launch record without its place: the node that runs it fills in its address,
    port and cores or GPUs (seer.fleet.ray_hosts.ProcessHost.start_instance)."""
    return InstanceSpec(
        name=f"inst{i}", model=launch.model_dir, port=0, dtype=launch.dtype,
        max_model_len=launch.max_model_len, kv_cache_bytes=cfg.kv_cache_bytes, max_num_seqs=cfg.max_num_seqs,
        seed=launch.seed, extra_args=tuple(cfg.extra_args), scheduling_policy=launch.scheduling_policy,
        token=token,
    )


__all__ = ["Dropped", "Fleet", "FleetError", "LaunchSettings", "StaleWeightsError", "base_spec"]
