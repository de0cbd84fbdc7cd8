"""The global KV pool of a run: started (or joined) before the instances, stopped after them.

Usage in the run loop:

    with KVPool.start(cfg.kvpool, run_dir / "kvpool") as kv:
        specs = [kv.configure(s) for s in specs]       # adds --kv-transfer-config and env
        with InstancePool.launch(specs, log_dir) as pool:
            ...

The pool must be up before the instances: each instance's connector registers with the master
at start-up and vLLM refuses to start if that fails. Once running, losing the master only
costs re-prefill (the connector treats a failed lookup as a miss), never wrong tokens.
"""

from __future__ import annotations

import atexit
import tempfile
import urllib.request
from pathlib import Path

from seer.kvpool.accounting import MasterStats
from seer.kvpool.config import KVPoolConfig
from seer.kvpool.connector import InstancePoolSettings, instance_settings
from seer.kvpool.processes import GuardedProcess, PoolEndpoints, start_master, start_store
from seer.rollout.instance import InstanceSpec


class KVPool:
    """Handles to the pool's processes (when launched here) and how instances reach it."""

    def __init__(
        self,
        config: KVPoolConfig,
        endpoints: PoolEndpoints | None,
        work_dir: Path,
        master: GuardedProcess | None = None,
        store: GuardedProcess | None = None,
    ):
        self.config = config
        self.endpoints = endpoints
        self.work_dir = Path(work_dir)
        self.master = master
        self.store = store
        self._closed = False
        if master is not None or store is not None:
            atexit.register(self.close)

    @classmethod
    def start(cls, config: KVPoolConfig, work_dir: str | Path | None = None) -> KVPool:
        """Launch (or join) the pool; a disabled config gives a pool that configures nothing."""
        work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="seer-kvpool-"))
        work.mkdir(parents=True, exist_ok=True)
        if not config.enabled:
            return cls(config, None, work)
        if not config.launches_master:
            endpoints = PoolEndpoints(config.master_address, config.metadata_server)
            pool = cls(config, endpoints, work)
            if config.capacity_bytes > 0:
                try:
                    pool.store = start_store(config, endpoints, work)
                except BaseException:
                    pool.close()
                    raise
                atexit.register(pool.close)
            return pool
        master, endpoints = start_master(config, work)
        pool = cls(config, endpoints, work, master=master)
        try:
            pool.store = start_store(config, endpoints, work)
        except BaseException:
            pool.close()
            raise
        return pool

    @property
    def enabled(self) -> bool:
        return self.endpoints is not None

    def settings(self, spec: InstanceSpec) -> InstancePoolSettings:
        """Flags and env for one instance (writes its Mooncake JSON under work_dir)."""
        if self.endpoints is None:
            return InstancePoolSettings(extra_args=())
        return instance_settings(self.config, self.endpoints, spec, self.work_dir)

    def configure(self, spec: InstanceSpec) -> InstanceSpec:
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

    def close(self) -> None:
        """Stop the store, then the master (the store's unmount needs the master)."""
        if self._closed:
            return
        self._closed = True
        for proc in (self.store, self.master):
            if proc is not None:
                proc.stop()

    def __enter__(self) -> KVPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
