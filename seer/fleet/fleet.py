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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from seer.dgds.server.config import DGDSConfig
from seer.fleet.client import InstanceClient
from seer.fleet.config import ClusterConfig, InstancesConfig
from seer.fleet.instance import InstanceSpec
from seer.fleet.pool import InstancePool
from seer.fleet.weight_files import KEEP_VERSIONS, manifest_json
from seer.fleet.weights import StaleWeightsError, clear_pool, load_into, require_version, weight_version
from seer.kvpool.config import KVPoolConfig
from seer.types import InstanceDrop, WeightsRef


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
                 driver_node: str | None = None):
        self.pool = pool
        self.kv = kv
        self.dgds = dgds
        self.notify = notify or (lambda msg: None)
        self.dropped: list[Dropped] = []
        self.placement = placement  # seer.fleet.ray_hosts.Placement of launched instances
        self.cluster = cluster  # seer.fleet.ray_cluster.RayCluster
        self.cluster_cfg = cluster_cfg or ClusterConfig()
        self.driver_node = driver_node  # the Ray node id of this driver
        # Weights delivered through Ray: this fleet's folder name on every node, and per node
        # {version: record of the delivery} (the newest KEEP_VERSIONS; a node holds nothing older).
        self.weights_key = f"fleet-{secrets.token_hex(6)}"
        self.deliveries: dict[str, dict[int, dict]] = {}
        self._said_transport = False

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
    ) -> Fleet:
        """Place one Ray actor per instance (a one-node Ray started here unless `cluster` names
        one), start the KV master and the DGDS server on this node and a KV store on every node that
        hosts instances, then the instances (which register with both) on their nodes, and wait
        until every instance answers; anything started is stopped if a later step fails."""
        from seer.dgds.server.service import DGDSService
        from seer.fleet.ray_cluster import RayCluster
        from seer.kvpool.pool import KVPool

        work = Path(work_dir)
        cfg = cluster or ClusterConfig()
        ray_cluster = RayCluster.connect(cfg, work / "logs")  # before ray is imported: it reads its auth settings then
        from seer.fleet.ray_hosts import Placement, RemoteServer
        started: list = [ray_cluster]
        try:
            say = notify or (lambda msg: None)
            if ray_cluster.started_here:
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

        return cls(pool, kv, ds, notify, placement, ray_cluster, cfg, driver_node_id())

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

    @property
    def weight_transport(self) -> str:
        """How `load_weights` moves a version to the instances: "shared-fs" (they read the path of
        the WeightsRef) or "ray" (its files travel through Ray to a directory on each node). A job
        asks before exporting: "ray" wants a WeightsRef with a payload (the fleet puts a local
        directory's files into Ray itself otherwise). cluster.weight_transport, where "auto" is
        shared-fs while every live instance runs on the driver's node; attached instances: shared-fs."""
        if not self.launched:
            return "shared-fs"
        if self.cluster_cfg.weight_transport != "auto":
            return self.cluster_cfg.weight_transport
        nodes = {s.node.node_id for s in self._live_servers()}
        return "shared-fs" if self.driver_node is not None and nodes <= {self.driver_node} else "ray"

    def _live_servers(self) -> list:
        live = set(self.pool.names)
        return [s for s in self.pool.servers if s.spec.name in live]

    # ---- faults ---------------------------------------------------------------------------
    def nodes(self) -> dict[str, str]:
        """Each live launched instance's node address (empty for attached instances)."""
        return {s.spec.name: s.node.ip for s in self._live_servers() if getattr(s, "node", None) is not None}

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
        """Drop every instance that does not answer /health; returns their names."""
        clients = self.backends
        ok = await asyncio.gather(*(c.healthy() for c in clients))
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
        weights is never reused), and check each serves `ref.version`. Returns seconds.

        With a payload (or weight_transport "ray") the version's files are first delivered to
        every node that hosts instances, once per node, into that node's own directory, and each
        instance loads from its node's copy; the node's host and every worker check the files
        against the manifest (size, sha256) before anything is applied. An instance whose delivery
        or load fails is retried once (re-delivered), then dropped with the reason; when every
        instance fails the fleet cannot go on (FleetError). An instance that refused a version keeps
        serving its old one, and one that failed mid-load reports no version (-1) until dropped."""
        t0 = time.monotonic()
        await self.revive_services("before the weight update")
        await self.drop_unhealthy("before the weight update")
        version = ref.version
        if ref.payload is not None or self.weight_transport == "ray":
            if not self.launched:
                raise FleetError("a weight payload needs launched instances; attached ones load local paths only")
            if ref.payload is None:
                ref = await asyncio.to_thread(self._put_local, ref)
            if not ref.manifest:
                raise FleetError(f"weight version {version}: a payload without a manifest cannot be checked")
            if not self._said_transport:
                self._said_transport = True
                where = self.cluster_cfg.weights_dir or "under each node's Ray session directory"
                nodes = len({s.node.node_id for s in self._live_servers()})
                self.notify(f"weights travel through Ray to a directory on each of the instances' {nodes} "
                            f"node(s) ({where}), checked by size and sha256 before they are loaded")
            manifest, delivered = manifest_json(ref.manifest), True

            async def place(node: str | None, fresh: bool) -> str:
                return await self._deliver(node, ref, fresh)
        else:
            path = ref.local_path
            if path is None:
                raise FleetError(f"this fleet loads weights from local paths or Ray payloads, not {ref.uri!r}")
            manifest, delivered = (manifest_json(ref.manifest) if ref.manifest else ""), False

            async def place(node: str | None, fresh: bool) -> str:
                return path

        clients = {c.name: c for c in self.backends}
        node_of = {s.spec.name: s.node.node_id for s in self._live_servers() if getattr(s, "node", None)}

        async def attempt(names: list[str], fresh: bool) -> dict[str, Exception]:
            nodes = sorted({node_of.get(n) for n in names}, key=str)
            dirs = dict(zip(nodes, await asyncio.gather(*(place(nd, fresh) for nd in nodes), return_exceptions=True)))

            async def one(name: str) -> None:
                where = dirs[node_of.get(name)]
                if isinstance(where, BaseException):
                    raise where
                await load_into(clients[name], where, version, manifest)

            results = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, Exception):
                    raise r
            return {n: r for n, r in zip(names, results) if isinstance(r, Exception)}

        failed = await attempt(list(clients), fresh=False)
        for name, e in failed.items():
            self.notify(f"{name}: loading weight version {version} failed: {_why(e)}; "
                        + ("re-delivering and retrying once" if delivered else "retrying once"))
        still = await attempt(list(failed), fresh=True) if failed else {}
        if still and len(still) == len(clients):
            raise FleetError(f"weight version {version} could not be loaded into any instance: "
                             + "; ".join(f"{n}: {_why(e)}" for n, e in still.items()))
        for name, e in still.items():
            self.drop(name, f"weight version {version} failed to load, twice: {_why(e)}",
                      "during the weight update")

        async def check(cs):
            if self.kv_pool_on:
                await clear_pool(cs[0])
            await require_version(cs, version)

        await self._on_live("during the weight update", check)
        return time.monotonic() - t0

    def _put_local(self, ref: WeightsRef) -> WeightsRef:
        """A local checkpoint directory's files into Ray (from the driver), for nodes that cannot read it."""
        import ray

        path = ref.local_path
        if path is None:
            raise FleetError(f"weight version {ref.version}: no payload and no local directory ({ref.uri!r})")
        files = {f.name: f.read_bytes() for f in sorted(Path(path).iterdir())
                 if f.is_file() and not f.name.startswith(".")}
        obj = ray.put(files)
        return replace(ref, uri=f"ray://{obj.hex()}", payload=obj, manifest=WeightsRef.manifest_of(files))

    async def _deliver(self, node: str, ref: WeightsRef, fresh: bool) -> str:
        """`ref`'s files in `node`'s directory: delivered by one live instance's host on that node
        (once per node however many instances it hosts); a version the node already holds is
        reused unless `fresh` (its workers check it again before loading it)."""
        held = self.deliveries.setdefault(node, {})
        if not fresh and ref.version in held:
            return held[ref.version]["dir"]
        host = next(s for s in self._live_servers() if s.node.node_id == node)
        t0 = time.monotonic()
        rec = await asyncio.to_thread(host.deliver_weights, ref.payload, ref.version, ref.manifest,
                                      self.cluster_cfg.weights_dir, self.weights_key)
        rec = {**rec, "node": host.node.ip, "version": ref.version, "seconds": time.monotonic() - t0}
        held.pop(ref.version, None)
        held[ref.version] = rec
        while len(held) > KEEP_VERSIONS:  # as the node keeps them: the newest deliveries
            del held[next(iter(held))]
        return rec["dir"]

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
        """Stop what this fleet launched: instances first, then DGDS and the pool, then Ray (and the
        weights delivered to each node)."""
        self._remove_deliveries()
        self.pool.close()
        for service in (self.dgds, self.kv, self.placement, self.cluster):
            if service is not None:
                service.close()

    def _remove_deliveries(self) -> None:
        for node in list(self.deliveries):
            host = next((s for s in self.pool.servers if getattr(s, "node", None) is not None
                         and s.node.node_id == node and not s.lost), None)
            if host is not None:
                host.remove_weights(self.cluster_cfg.weights_dir, self.weights_key)
        self.deliveries.clear()

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _why(e: BaseException) -> str:
    """A failure in one line, named by its type unless its message already says whose it is."""
    text = " ".join(str(e).split())
    return text if isinstance(e, (RuntimeError, ValueError)) and text else f"{type(e).__name__}: {text}"


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
