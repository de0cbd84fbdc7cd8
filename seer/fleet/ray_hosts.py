"""Processes on the nodes of a Ray cluster: one actor per vLLM instance, one per node's KV store.

Each actor runs its one process under seer.procs.guard on its own node, bound to that node's
address and pinned to that node's cores, so it dies with the actor (and with the node). The driver
holds a `RemoteProcess` per actor, with GuardedProcess's interface, so the instance pool and the KV
pool treat a process on another node as one started here. A call to an actor on a lost node
fails; the handle then answers "not alive", which is how a lost node's instances get dropped.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from seer.fleet.config import ClusterConfig
from seer.fleet.instance import InstanceSpec, VLLMServer
from seer.fleet.weight_files import write_version
from seer.fleet.ray_cluster import ClusterError, NodeInfo
from seer.kvpool.config import KVPoolConfig
from seer.kvpool.connector import instance_settings
from seer.kvpool.processes import PoolEndpoints, store_process
from seer.procs import GuardedProcess, cpu_sets, free_port, remote_error_line
from seer.procs.contain import protect
from seer.procs.process import _children

CALL_TIMEOUT_S = 30.0


class ProcessHost:
    """A Ray actor that runs one guarded process on its node (a vLLM server or a Mooncake store)."""

    def __init__(self):
        protect()  # it holds the instances' secret (the spec's token): not readable through /proc
        self.proc: GuardedProcess | None = None

    def info(self) -> NodeInfo:
        ctx = ray.get_runtime_context()
        return NodeInfo(ctx.get_node_id(), ray.util.get_node_ip_address(), tuple(sorted(os.sched_getaffinity(0))),
                        tuple(str(g) for g in ray.get_gpu_ids()))

    def start_instance(self, spec: InstanceSpec, cpus: str | None, kv: tuple[KVPoolConfig, PoolEndpoints] | None,
                       work_dir: str) -> InstanceSpec:
        """Complete `spec` for this node (its address, a free port here, its cores or GPUs, the KV
        connector's config written here) and start the server; returns the completed spec."""
        ip = ray.util.get_node_ip_address()
        gpus = ",".join(str(g) for g in ray.get_gpu_ids()) or None
        spec = replace(spec, host=ip, port=free_port(ip), cpus=None if gpus else cpus, gpus=gpus)
        if kv is not None:
            cfg, endpoints = kv
            spec = instance_settings(replace(cfg, host=ip), endpoints, spec, Path(work_dir) / "kvpool").apply(spec)
        self.proc = VLLMServer(spec, Path(work_dir) / "logs" / f"{spec.name}.log")
        self.proc.start()
        return spec

    def start_store(self, cfg: KVPoolConfig, endpoints: PoolEndpoints, work_dir: str, name: str) -> list[str]:
        """This node's share of the KV pool, on this node's address; returns its command line."""
        self.proc = store_process(replace(cfg, host=ray.util.get_node_ip_address()), endpoints,
                                  Path(work_dir) / "kvpool", name)
        self.proc.start()
        return self.proc.command

    def receive_weights(self, files: dict[str, bytes], version: int, manifest: tuple, root: str | None,
                        key: str) -> dict:
        """A weight version's files into this node's directory for the fleet `key`, checked against
        `manifest` (size and sha256 of every file) before they are written. `files` arrives resolved:
        the driver passes the trainer's ObjectRef as an argument, so this node fetches it from the
        node that holds it. Keeps the newest two versions. Returns {dir, bytes, write_s}."""
        t0 = time.monotonic()
        out = write_version(files, tuple(tuple(m) for m in manifest), node_weights_root(root) / key, version)
        return {"dir": str(out), "bytes": sum(len(b) for b in files.values()), "write_s": time.monotonic() - t0}

    def remove_weights(self, root: str | None, key: str) -> None:
        shutil.rmtree(node_weights_root(root) / key, ignore_errors=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        return "" if self.proc is None else self.proc.log_tail(lines)

    def pids(self) -> list[int]:
        """The guard and the process group leaders it started (for tests and fault injection)."""
        if self.proc is None or self.proc.proc is None:
            return []
        return [self.proc.proc.pid, *_children(self.proc.proc.pid)]

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is not None:
            self.proc.stop(timeout_s)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()


def node_weights_root(configured: str | None) -> Path:
    """Where weight versions live on this node: `configured` (cluster.weights_dir), else a folder of
    this node's Ray session directory (each node's own, under its `--temp-dir`; Ray removes it with
    the session)."""
    if configured:
        return Path(configured)
    try:
        return Path(ray._private.worker._global_node.get_session_dir_path()) / "seer_weights"
    except Exception:  # Ray's private layout moved: the node's temporary directory
        import tempfile

        return Path(tempfile.gettempdir()) / "seer_weights"


class WeightDeliveryError(RuntimeError):
    """A weight version did not reach a node whole (its actor is alive: the delivery may be retried)."""


class RemoteProcess:
    """The driver's handle on a ProcessHost actor, with GuardedProcess's interface."""

    def __init__(self, name: str, actor, node: NodeInfo, log_path: Path, command: list[str] | None = None):
        self.name = name
        self.actor = actor
        self.node = node
        self.log_path = log_path  # on the actor's node
        self.command = command or []
        self.started_at = time.monotonic()
        self._lost: str | None = None  # why calls to the actor fail (its node or worker is gone)
        self._stopping = None  # the stop `terminate` asked for (`stop` waits on the actor after it)

    def _call(self, method: str, *args, timeout_s: float = CALL_TIMEOUT_S):
        if self._lost is not None:
            raise ClusterError(self._lost)
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout_s)
        except Exception as e:  # actor or node dead, call timed out, Ray already shut down
            self._lost = f"{self.name}'s actor on node {self.node.ip} is unreachable: {type(e).__name__}"
            raise ClusterError(self._lost) from e

    def deliver_weights(self, payload, version: int, manifest: tuple, root: str | None, key: str,
                        timeout_s: float = 600.0) -> dict:
        """Have this actor's node fetch `payload` (a Ray ObjectRef, passed as a top-level argument so
        Ray resolves it on that node) and write it as a checked version directory; returns its
        record. A failure of the delivery itself (a mismatch, the object lost, too slow) raises
        WeightDeliveryError; only a dead actor marks this handle lost."""
        if self._lost is not None:
            raise ClusterError(self._lost)
        try:
            return ray.get(self.actor.receive_weights.remote(payload, version, manifest, root, key),
                           timeout=timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
            self._lost = f"{self.name}'s actor on node {self.node.ip} is unreachable: {type(e).__name__}"
            raise ClusterError(self._lost) from e
        except Exception as e:  # the host raised (a mismatch), the object lost with its owner, a timeout
            raise WeightDeliveryError(f"delivery of weight version {version} to node {self.node.ip} failed: "
                                      f"{remote_error_line(e)}") from e

    def remove_weights(self, root: str | None, key: str) -> None:
        try:
            self._call("remove_weights", root, key, timeout_s=15.0)
        except ClusterError:
            pass

    @property
    def lost(self) -> str | None:
        return self._lost

    def alive(self) -> bool:
        try:
            return bool(self._call("alive", timeout_s=10.0))
        except ClusterError:
            return False

    @property
    def returncode(self) -> int | None:
        try:
            return self._call("returncode", timeout_s=10.0)
        except ClusterError:
            return -9

    def log_tail(self, lines: int = 30) -> str:
        try:
            return self._call("log_tail", lines, timeout_s=10.0)
        except ClusterError as e:
            return f"({e})"

    def pids(self) -> list[int]:
        return self._call("pids")

    def terminate(self) -> None:
        """Ask for a stop without waiting (`stop` waits)."""
        if self._lost is None:
            self._stopping = self.actor.stop.remote()

    def stop(self, timeout_s: float = 30.0) -> None:
        try:
            self._call("stop", timeout_s, timeout_s=timeout_s + 15)
        except ClusterError:
            pass  # its node is gone, and the guard took the process with it
        self._release()

    def kill(self) -> None:
        try:
            self._call("kill", timeout_s=15.0)
        except ClusterError:
            pass
        self._release()

    def _release(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # already dead with its node
            pass


class RemoteServer(RemoteProcess):
    """A vLLM instance on a node of the cluster: RemoteProcess plus its (completed) spec."""

    def __init__(self, spec: InstanceSpec, actor, node: NodeInfo, cpus: str | None,
                 kv: tuple[KVPoolConfig, PoolEndpoints] | None, work_dir: str):
        super().__init__(spec.name, actor, node, Path(work_dir) / "logs" / f"{spec.name}.log")
        self.spec = spec
        self._launch = (cpus, kv, work_dir)

    def start(self) -> None:
        self.spec = self._call("start_instance", self.spec, *self._launch, timeout_s=120.0)
        self.started_at = time.monotonic()


_Host = ray.remote(ProcessHost)


class Placement:
    """The run's placement group: one bundle per instance, each with its actor and node."""

    def __init__(self, pg, actors: list, nodes: list[NodeInfo]):
        self.pg = pg
        self.actors = actors
        self.nodes = nodes

    @classmethod
    def create(cls, count: int, cfg: ClusterConfig) -> Placement:
        bundle = {k: v for k, v in (("CPU", cfg.cpus_per_instance), ("GPU", cfg.gpus_per_instance)) if v}
        pg = placement_group([dict(bundle) for _ in range(count)], strategy=cfg.placement_strategy)
        try:
            ray.get(pg.ready(), timeout=cfg.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            resources = ray.available_resources()
            remove_placement_group(pg)
            raise ClusterError(
                f"Ray could not place {count} instances of {bundle} ({cfg.placement_strategy}) within "
                f"{cfg.placement_timeout_s:.0f} s; the cluster has {resources} free, on "
                f"{len([n for n in ray.nodes() if n['Alive']])} live nodes") from None
        actors = [
            _Host.options(num_cpus=cfg.cpus_per_instance, num_gpus=cfg.gpus_per_instance, max_restarts=0,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
                          ).remote()
            for i in range(count)
        ]
        try:
            nodes = ray.get([a.info.remote() for a in actors], timeout=cfg.placement_timeout_s)
        except BaseException:
            for a in actors:
                ray.kill(a)
            remove_placement_group(pg)
            raise
        return cls(pg, actors, nodes)

    def core_sets(self) -> list[str]:
        """Each instance's cores: its node's cores split among that node's instances."""
        by_node: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            by_node.setdefault(n.node_id, []).append(i)
        out = [""] * len(self.nodes)
        for ids in by_node.values():
            for i, cores in zip(ids, cpu_sets(len(ids), list(self.nodes[ids[0]].cores))):
                out[i] = cores
        return out

    def distinct_nodes(self) -> list[NodeInfo]:
        seen: dict[str, NodeInfo] = {}
        for n in self.nodes:
            seen.setdefault(n.node_id, n)
        return list(seen.values())

    def start_stores(self, cfg: KVPoolConfig, endpoints: PoolEndpoints, work_dir: str) -> list[RemoteProcess]:
        """One store per node that hosts instances, pinned to that node (not part of the bundles)."""
        stores = []
        for k, node in enumerate(self.distinct_nodes()):
            actor = _Host.options(num_cpus=0, max_restarts=0,
                                  scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
            name = f"mooncake_store{k}"
            command = ray.get(actor.start_store.remote(cfg, endpoints, work_dir, name), timeout=CALL_TIMEOUT_S)
            stores.append(RemoteProcess(name, actor, node, Path(work_dir) / "kvpool" / f"{name}.log", command))
        return stores

    def close(self) -> None:
        try:
            remove_placement_group(self.pg)
        except Exception:
            pass


def driver_node_id() -> str | None:
    """The Ray node this process (the driver) runs on."""
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def node_alive(node_id: str) -> bool | None:
    """Ray's view of a node (None when Ray cannot be asked)."""
    try:
        return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
    except Exception:
        return None


__all__ = ["Placement", "ProcessHost", "RemoteProcess", "RemoteServer", "WeightDeliveryError", "driver_node_id", "node_alive",
           "node_weights_root"]
