"""The global KV pool of a run: started (or joined) before the instances, stopped after them.

Usage in the run loop:

    with KVPool.start(cfg.kvpool, run_dir / "kvpool") as kv:
        specs = [kv.configure(s) for s in specs]       # adds --kv-transfer-config and env
        with InstancePool.launch(specs, log_dir) as pool:
            ...

The pool must be up before the instances: each instance's connector registers with the master
at start-up and vLLM refuses to start if that fails. Once running, losing the master only
costs re-prefill (the connector treats a failed lookup as a miss), never wrong tokens. A
master launched here that died is started again on its own address by `restart_master` (the
run loop calls `ensure_master` before each rollout and weight update); the store and the
instances reconnect to it by themselves, with no instance restart, and the pool starts empty.
"""

from __future__ import annotations

import atexit
from dataclasses import replace
import tempfile
import time
import urllib.request
from pathlib import Path

from seer.kvpool.accounting import MasterStats
from seer.kvpool.config import KVPoolConfig
from seer.kvpool.connector import InstancePoolSettings, instance_settings
from seer.kvpool.processes import (
    GuardedProcess,
    PoolEndpoints,
    PoolStartError,
    restart_master,
    segment_mounted,
    start_master,
    start_store,
    wait_store_ready,
)
from seer.types import LaunchSpec


class KVPool:
    """Handles to the pool's processes (when launched here) and how instances reach it."""

    def __init__(
        self,
        config: KVPoolConfig,
        endpoints: PoolEndpoints | None,
        work_dir: Path,
        master: GuardedProcess | None = None,
        stores: list | None = None,
    ):
        self.config = config
        self.endpoints = endpoints
        self.work_dir = Path(work_dir)
        self.master = master
        # The pool's memory: one store here, or one per node of a cluster (seer.fleet's Ray hosts
        # start those and add them); each has GuardedProcess's alive/stop/log_tail.
        self.stores: list = list(stores or [])
        self._closed = False
        atexit.register(self.close)

    @classmethod
    def start(cls, config: KVPoolConfig, work_dir: str | Path | None = None, local_store: bool = True) -> KVPool:
        """Launch (or join) the pool; a disabled config gives a pool that configures nothing.
        `local_store=False` starts no store here: a cluster's nodes bring theirs (`add_store`)."""
        work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="seer-kvpool-"))
        work.mkdir(parents=True, exist_ok=True)
        if not config.enabled:
            return cls(config, None, work)
        if config.launches_master:
            master, endpoints = start_master(config, work)
        else:
            master, endpoints = None, PoolEndpoints(config.master_address, config.metadata_server)
        pool = cls(config, endpoints, work, master=master)
        if local_store and config.capacity_bytes > 0:
            try:
                pool.stores.append(start_store(config, endpoints, work))
            except BaseException:
                pool.close()
                raise
        return pool

    def add_store(self, proc) -> None:
        """A started store (here or on another node): wait until the master counts its memory."""
        self.stores.append(proc)
        wait_store_ready(proc, replace(self.config, host=_store_host(proc)), self.endpoints,
                         self.config.capacity_bytes * len(self.stores))

    @property
    def enabled(self) -> bool:
        return self.endpoints is not None

    def settings(self, spec: LaunchSpec) -> InstancePoolSettings:
        """Flags and env for one instance (writes its Mooncake JSON under work_dir)."""
        if self.endpoints is None:
            return InstancePoolSettings(extra_args=())
        return instance_settings(self.config, self.endpoints, spec, self.work_dir)

    def configure(self, spec: LaunchSpec) -> LaunchSpec:
        """`spec` with the pool's connector flags and env added; unchanged when the pool is off."""
        return self.settings(spec).apply(spec)

    def master_stats(self) -> MasterStats | None:
        """Fill level and evictions from the master's /metrics (None when its metrics are unknown)."""
        if self.endpoints is None or self.endpoints.metrics_url is None:
            return None
        with urllib.request.urlopen(self.endpoints.metrics_url, timeout=5.0) as r:
            return MasterStats.from_metrics(r.read().decode())

    def stop_master(self) -> None:
        """Stop the master only (fault injection: instances must fall back to re-prefill)."""
        if self.master is not None:
            self.master.stop()

    def master_alive(self) -> bool | None:
        """Whether the master launched here is running (None: joined, not ours to watch)."""
        return None if self.master is None else self.master.alive()

    def restart_master(self, timeout_s: float | None = None) -> float:
        """Start the master launched here again on the same address; seconds until usable.

        Usable = its ports listen and every live store of the pool has
        re-mounted its segment (its heartbeat does that by itself, within seconds), so puts
        succeed again. The new master starts empty: every stored prefix is recomputed once.
        """
        if self.master is None or self.endpoints is None:
            raise RuntimeError("restart_master: the master was not launched by this pool")
        timeout = self.config.ready_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        self.master = restart_master(self.master, self.endpoints, timeout)
        stores = [s for s in self.stores if s.alive()]  # a store lost with its node stays lost
        while stores and not segment_mounted(self.endpoints, self.config.capacity_bytes * len(stores)):
            for store in stores:
                if not store.alive():
                    raise PoolStartError(f"{store.name} exited after the master restart:\n{store.log_tail()}")
            if time.monotonic() - t0 > timeout:
                raise PoolStartError(
                    f"the stores did not re-mount their segments within {timeout:.0f}s of the master restart:\n"
                    + "\n".join(s.log_tail() for s in stores)
                )
            time.sleep(0.1)
        return time.monotonic() - t0

    def ensure_master(self) -> float | None:
        """Restart the master launched here if it has exited; seconds taken, or None if it was up."""
        if self._closed or self.master is None or self.master.alive():
            return None
        return self.restart_master()

    def close(self) -> None:
        """Stop the store, then the master (the store's unmount needs the master)."""
        if self._closed:
            return
        self._closed = True
        for proc in (*self.stores, self.master):
            if proc is not None:
                proc.stop()

    def __enter__(self) -> KVPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _store_host(proc) -> str:
    return next(a for a in proc.command if a.startswith("--host=")).split("=", 1)[1]
