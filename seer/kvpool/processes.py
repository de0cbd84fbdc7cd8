"""The pool's own processes: `mooncake_master` and the standalone `mooncake_client` store.

Both are native binaries shipped inside the `mooncake` wheel. They run under
seer.procs.guard, like vLLM servers, so a SIGKILL of the driver still takes them down: a
leaked master keeps its ports and a leaked store keeps gigabytes of pinned memory.

The store is a separate process on purpose: in Mooncake's default `embedded` mode the KV a
vLLM instance writes lives in that instance's own segment and disappears when it exits; a
standalone store outlives instances and is the pool's memory.
"""

from __future__ import annotations

import os
import socket
import stat
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import mooncake

from seer.kvpool.config import KVPoolConfig
from seer.procs import free_port, port_open
from seer.procs import GuardedProcess


class PoolStartError(RuntimeError):
    """A pool process exited or did not become ready; carries the tail of its log."""


def mooncake_binary(name: str) -> str:
    """Path of a native Mooncake binary in the installed wheel (made executable if needed)."""
    path = Path(mooncake.__file__).parent / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} not found in the mooncake package at {path.parent}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@dataclass(frozen=True)
class PoolEndpoints:
    """How instances reach the pool: what goes into each instance's Mooncake JSON config."""

    master_address: str  # host:port of mooncake_master's RPC service
    metadata_server: str  # HTTP metadata server URL (transfer-engine segment descriptors)
    metrics_url: str | None = None  # master's Prometheus /metrics, when known


def check_alive(proc: GuardedProcess) -> None:
    if not proc.alive():
        raise PoolStartError(f"{proc.name} exited (code {proc.returncode}); log {proc.log_path}:\n{proc.log_tail()}")


def _metric(url: str, name: str) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def start_master(cfg: KVPoolConfig, log_dir: Path) -> tuple[GuardedProcess, PoolEndpoints]:
    """mooncake_master on cfg.host with free ports and its in-process HTTP metadata server."""
    host = cfg.host
    rpc, http, metrics = free_port(host), free_port(host), free_port(host)
    cmd = [
        mooncake_binary("mooncake_master"),
        f"--rpc_address={host}", f"--rpc_port={rpc}", "--rpc_thread_num=2",
        "--enable_http_metadata_server=true", f"--http_metadata_server_host={host}",
        f"--http_metadata_server_port={http}",
        f"--metrics_host={host}", f"--metrics_port={metrics}",
        f"--eviction_high_watermark_ratio={cfg.eviction_high_watermark}",
        f"--eviction_ratio={cfg.eviction_ratio}",
        f"--default_kv_lease_ttl={cfg.kv_lease_ttl_ms}",
        f"--client_ttl={cfg.client_ttl_s}",
        "--logtostderr",
    ]
    proc = GuardedProcess("mooncake_master", cmd, log_dir / "mooncake_master.log")
    proc.start()
    endpoints = PoolEndpoints(f"{host}:{rpc}", f"http://{host}:{http}/metadata", f"http://{host}:{metrics}/metrics")
    _wait_master_ready(proc, endpoints, cfg.ready_timeout_s)
    return proc, endpoints


def restart_master(old: GuardedProcess, endpoints: PoolEndpoints, timeout_s: float) -> GuardedProcess:
    """mooncake_master again with `old`'s command line: the same address and ports, empty state.

    A restarted master knows no segment and no object. Mooncake's clients recover by
    themselves (found in the mooncake wheel this project pins, checked by
    tests/kvpool/test_pool_integration.py): the standalone store's heartbeat sees the new
    master, re-mounts its segment and re-publishes its transfer-engine metadata, and each
    vLLM instance's store client re-connects on its next call (its first call after the
    restart may still fail: one more miss).
    """
    old.stop()
    proc = GuardedProcess(old.name, old.command, old.log_path, env=old.env)
    proc.start()
    _wait_master_ready(proc, endpoints, timeout_s)
    return proc


def _wait_master_ready(proc: GuardedProcess, endpoints: PoolEndpoints, timeout_s: float) -> None:
    """Until the master's RPC, HTTP metadata and metrics ports listen (or it exits: PoolStartError)."""
    addrs = [endpoints.master_address, endpoints.metadata_server, endpoints.metrics_url or ""]
    ports = [_host_port(a) for a in addrs if a]
    deadline = time.monotonic() + timeout_s
    while not all(port_open(h, p) for h, p in ports):
        check_alive(proc)
        if time.monotonic() > deadline:
            proc.stop()
            raise PoolStartError(f"mooncake_master not ready after {timeout_s:.0f}s:\n{proc.log_tail()}")
        time.sleep(0.2)


def _host_port(address: str) -> tuple[str, int]:
    """("127.0.0.1", 5000) from "127.0.0.1:5000" or "http://127.0.0.1:5000/metadata"."""
    hostport = address.split("://", 1)[-1].split("/", 1)[0]
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


def segment_mounted(endpoints: PoolEndpoints, capacity_bytes: int) -> bool:
    """Whether the master counts at least `capacity_bytes` of mounted store memory."""
    if endpoints.metrics_url is None:
        return False
    mounted = _metric(endpoints.metrics_url, "master_total_capacity_bytes")
    return mounted is not None and mounted >= capacity_bytes


def store_process(cfg: KVPoolConfig, endpoints: PoolEndpoints, log_dir: Path, name: str = "mooncake_store") -> GuardedProcess:
    """The standalone mooncake_client whose global segment (cfg.capacity_bytes) is memory of the
    pool, on cfg.host (its node's address: other nodes fetch from it there). Not started yet."""
    host = cfg.host
    port = free_port(host)  # also names its local socket: two stores on one host need two ports
    cmd = [
        mooncake_binary("mooncake_client"),
        f"--master_server_address={endpoints.master_address}",
        f"--metadata_server={endpoints.metadata_server}",
        f"--host={host}", f"--port={port}",
        f"--global_segment_size={int(cfg.capacity_bytes)}",
        f"--protocol={cfg.protocol}", f"--device_names={cfg.device_name}",
        "--threads=1", "--logtostderr",
    ]
    return GuardedProcess(name, cmd, log_dir / f"{name}.log", env={"MC_TCP_BIND_ADDRESS": host})


def wait_store_ready(proc, cfg: KVPoolConfig, endpoints: PoolEndpoints, mounted_bytes: int | None = None) -> None:
    """Until the master counts `mounted_bytes` of store memory (default: this store's), when its
    metrics are known; else until the store's service port listens. `proc` may run on another node
    (anything with GuardedProcess's alive/stop/log_tail)."""
    want = cfg.capacity_bytes if mounted_bytes is None else mounted_bytes
    port = int(next(a for a in proc.command if a.startswith("--port=")).split("=", 1)[1])
    deadline = time.monotonic() + cfg.ready_timeout_s
    while True:
        check_alive(proc)
        if endpoints.metrics_url is not None:
            ready = segment_mounted(endpoints, want)
        else:
            ready = port_open(cfg.host, port)
        if ready:
            return
        if time.monotonic() > deadline:
            proc.stop()
            raise PoolStartError(f"mooncake store not ready after {cfg.ready_timeout_s:.0f}s:\n{proc.log_tail()}")
        time.sleep(0.2)


def start_store(cfg: KVPoolConfig, endpoints: PoolEndpoints, log_dir: Path) -> GuardedProcess:
    """A store on this machine, started and ready."""
    proc = store_process(cfg, endpoints, log_dir)
    proc.start()
    wait_store_ready(proc, cfg, endpoints)
    return proc
