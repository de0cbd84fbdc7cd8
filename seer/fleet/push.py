"""Weight pushes: how a new version reaches every live instance of a fleet, and nothing else.

One owner for the whole path, so that the transport is chosen once: `WeightPush.transport` picks
"shared-fs" or "ray", `export` asks the trainer for the weights in that form, `push` delivers
them (once per node for "ray"), has every instance load them, retries an instance that failed
once, drops one that failed twice, and checks that every instance serves the version. The fleet
(seer.fleet.fleet) keeps membership and faults; a push asks it for the live instances and hands
it the ones to drop. docs/weights.md describes both transports and what is checked.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from seer.fleet.weight_files import KEEP_VERSIONS, manifest_json
from seer.fleet.weights import clear_pool, load_into, require_version
from seer.types import WeightsRef

if TYPE_CHECKING:
    from seer.fleet.fleet import Fleet


class WeightSource(Protocol):
    """What a push exports from (seer.trainer.group.TrainerGroup)."""

    def publish(self, version: int) -> WeightsRef: ...  # the files as a Ray object, with their manifest

    def export_hf(self, out_dir: str | Path) -> Path: ...  # an HF directory on the driver's node


class WeightPush:
    """The weight pushes of one fleet (`Fleet.weights`): transport, export, delivery, load, retry,
    drop, check. Every method but `export` is a coroutine of the fleet's event loop."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        # Weights delivered through Ray: this fleet's folder name on every node, and per node
        # {version: record of the delivery} (the newest KEEP_VERSIONS; a node holds nothing older).
        self.key = f"fleet-{secrets.token_hex(6)}"
        self.deliveries: dict[str, dict[int, dict]] = {}
        self._said_transport = False

    @property
    def transport(self) -> str:
        """How `push` moves a version to the instances: "shared-fs" (they read the path of the
        WeightsRef) or "ray" (its files travel through Ray to a directory on each node).
        cluster.weight_transport, where "auto" is shared-fs while every live instance runs on the
        driver's node; attached instances: shared-fs."""
        fleet = self.fleet
        if not fleet.launched:
            return "shared-fs"
        if fleet.cluster_cfg.weight_transport != "auto":
            return fleet.cluster_cfg.weight_transport
        nodes = {s.node.node_id for s in fleet.live_servers()}
        return "shared-fs" if fleet.driver_node is not None and nodes <= {fleet.driver_node} else "ray"

    def export(self, trainer: WeightSource, version: int, out_dir: str | Path) -> WeightsRef:
        """The trainer's weights in the form the transport wants: Ray objects with a manifest, or an
        HF directory at `out_dir` (which the instances' shared filesystem shows them). Blocking."""
        if self.transport == "ray":
            return trainer.publish(version)
        return WeightsRef(version, str(trainer.export_hf(out_dir)))

    async def push_trained(self, trainer: WeightSource, version: int, out_dir: str | Path, *,
                           exported=None, if_stale: bool = False) -> float | None:
        """Export `version` from `trainer` and push it (`exported(version)` runs after the export:
        the run removes older exports). Seconds, export included. `if_stale`: only where some
        instance serves another version (attached instances may serve it already); None if none does."""
        t0 = time.monotonic()
        if if_stale and await self._all_serve(version):
            return None
        ref = await asyncio.to_thread(self.export, trainer, version, out_dir)
        if exported is not None:
            exported(version)
        await self.push(ref)
        return time.monotonic() - t0

    async def ensure(self, ref: WeightsRef) -> float | None:
        """Attached instances may serve another run's weights: push `ref` where they differ."""
        if await self._all_serve(ref.version):
            return None
        return await self.push(ref)

    async def _all_serve(self, version: int) -> bool:
        return all(v == version for v in (await self.fleet.versions()).values())

    async def push(self, ref: WeightsRef) -> float:
        """Load `ref` into every live instance, drop their prefix caches and the pool's (KV of old
        weights is never reused), and check each serves `ref.version`. Returns seconds.

        With a payload (or transport "ray") the version's files are first delivered to every node
        that hosts instances, once per node, into that node's own directory, and each instance
        loads from its node's copy; the node's host and every worker check the files against the
        manifest (size, sha256) before anything is applied. An instance whose delivery or load
        fails is retried once (re-delivered), then dropped with the reason; when every instance
        fails the fleet cannot go on (FleetError). An instance that refused a version keeps serving
        its old one, and one that failed mid-load reports no version (-1) until dropped."""
        from seer.fleet.fleet import FleetError

        fleet = self.fleet
        t0 = time.monotonic()
        await fleet.revive_services("before the weight update")
        await fleet.drop_unhealthy("before the weight update")
        version = ref.version
        if ref.payload is not None or self.transport == "ray":
            ref = await self._through_ray(ref)
            manifest, delivered = manifest_json(ref.manifest), True
        else:
            if ref.local_path is None:
                raise FleetError(f"this fleet loads weights from local paths or Ray payloads, not {ref.uri!r}")
            manifest, delivered = (manifest_json(ref.manifest) if ref.manifest else ""), False

        clients = {c.name: c for c in fleet.backends}
        failed = await self._attempt(ref, clients, list(clients), manifest, delivered, fresh=False)
        for name, e in failed.items():
            fleet.notify(f"{name}: loading weight version {version} failed: {_why(e)}; "
                         + ("re-delivering and retrying once" if delivered else "retrying once"))
        still = await self._attempt(ref, clients, list(failed), manifest, delivered, fresh=True) if failed else {}
        if still and len(still) == len(clients):
            raise FleetError(f"weight version {version} could not be loaded into any instance: "
                             + "; ".join(f"{n}: {_why(e)}" for n, e in still.items()))
        for name, e in still.items():
            fleet.drop(name, f"weight version {version} failed to load, twice: {_why(e)}",
                       "during the weight update")

        async def check(cs):
            if fleet.kv_pool_on:
                await clear_pool(cs[0])
            await require_version(cs, version)

        await fleet.on_live("during the weight update", check)
        return time.monotonic() - t0

    async def _through_ray(self, ref: WeightsRef) -> WeightsRef:
        """`ref` with a payload and a manifest, and the transport said once in the log."""
        from seer.fleet.fleet import FleetError

        fleet = self.fleet
        if not fleet.launched:
            raise FleetError("a weight payload needs launched instances; attached ones load local paths only")
        if ref.payload is None:
            ref = await asyncio.to_thread(self._put_local, ref)
        if not ref.manifest:
            raise FleetError(f"weight version {ref.version}: a payload without a manifest cannot be checked")
        if not self._said_transport:
            self._said_transport = True
            where = fleet.cluster_cfg.weights_dir or "under each node's Ray session directory"
            nodes = len({s.node.node_id for s in fleet.live_servers()})
            fleet.notify(f"weights travel through Ray to a directory on each of the instances' {nodes} "
                         f"node(s) ({where}), checked by size and sha256 before they are loaded")
        return ref

    async def _attempt(self, ref: WeightsRef, clients: dict, names: list[str], manifest: str, delivered: bool,
                       fresh: bool) -> dict[str, Exception]:
        """One try of `names`: place the version on their nodes (delivered, or the shared path),
        then load it into each. Returns the instances that failed, with why."""
        node_of = {s.spec.name: s.node.node_id for s in self.fleet.live_servers() if getattr(s, "node", None)}
        nodes = sorted({node_of.get(n) for n in names}, key=str)
        if delivered:
            places = await asyncio.gather(*(self.deliver(nd, ref, fresh) for nd in nodes), return_exceptions=True)
        else:
            places = [ref.local_path] * len(nodes)
        dirs = dict(zip(nodes, places))

        async def one(name: str) -> None:
            where = dirs[node_of.get(name)]
            if isinstance(where, BaseException):
                raise where
            await load_into(clients[name], where, ref.version, manifest)

        results = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r
        return {n: r for n, r in zip(names, results) if isinstance(r, Exception)}

    def _put_local(self, ref: WeightsRef) -> WeightsRef:
        """A local checkpoint directory's files into Ray (from the driver), for nodes that cannot read it."""
        import ray

        from seer.fleet.fleet import FleetError

        path = ref.local_path
        if path is None:
            raise FleetError(f"weight version {ref.version}: no payload and no local directory ({ref.uri!r})")
        files = {f.name: f.read_bytes() for f in sorted(Path(path).iterdir())
                 if f.is_file() and not f.name.startswith(".")}
        obj = ray.put(files)
        return replace(ref, uri=f"ray://{obj.hex()}", payload=obj, manifest=WeightsRef.manifest_of(files))

    async def deliver(self, node: str, ref: WeightsRef, fresh: bool) -> str:
        """`ref`'s files in `node`'s directory: delivered by one live instance's host on that node
        (once per node however many instances it hosts); a version the node already holds is
        reused unless `fresh` (its workers check it again before loading it)."""
        held = self.deliveries.setdefault(node, {})
        if not fresh and ref.version in held:
            return held[ref.version]["dir"]
        host = next(s for s in self.fleet.live_servers() if s.node.node_id == node)
        t0 = time.monotonic()
        rec = await asyncio.to_thread(host.deliver_weights, ref.payload, ref.version, ref.manifest,
                                      self.fleet.cluster_cfg.weights_dir, self.key)
        rec = {**rec, "node": host.node.ip, "version": ref.version, "seconds": time.monotonic() - t0}
        held.pop(ref.version, None)
        held[ref.version] = rec
        while len(held) > KEEP_VERSIONS:  # as the node keeps them: the newest deliveries
            del held[next(iter(held))]
        return rec["dir"]

    def close(self) -> None:
        """Remove this fleet's weight folders from every node they were delivered to (while its
        instances' hosts still run: the fleet closes this first)."""
        for node in list(self.deliveries):
            host = next((s for s in self.fleet.pool.servers if getattr(s, "node", None) is not None
                         and s.node.node_id == node and not s.lost), None)
            if host is not None:
                host.remove_weights(self.fleet.cluster_cfg.weights_dir, self.key)
        self.deliveries.clear()


def _why(e: BaseException) -> str:
    """A failure in one line, named by its type unless its message already says whose it is."""
    text = " ".join(str(e).split())
    return text if isinstance(e, (RuntimeError, ValueError)) and text else f"{type(e).__name__}: {text}"
