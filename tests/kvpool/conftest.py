"""One real pool (mooncake_master + standalone store) and two vLLM instances sharing it.

Module-scoped by design: vLLM start-up is the expensive part (a minute or more on a shared
2-core box), so every integration test of this directory runs against the same processes.
The pool is deliberately small (16 MiB = 256 blocks of the tiny model) so that one test can
fill it and check that a full pool degrades to re-prefill.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from seer.kvpool import KVPool, KVPoolConfig, kv_bytes_per_token

POOL_BYTES = 16 * 2**20  # Mooncake's smallest segment: 256 blocks of 64 KiB


@dataclass
class PoolRig:
    kv: KVPool
    instances: object  # seer.fleet.pool.InstancePool
    model: Path
    kv_bytes_per_token: int


@pytest.fixture(scope="package")
def rig(tiny_model, tmp_path_factory):
    from seer.fleet.instance import InstanceSpec
    from seer.procs import cpu_sets, free_port
    from seer.fleet.pool import InstancePool

    work = tmp_path_factory.mktemp("kvpool")
    cfg = KVPoolConfig(capacity_bytes=POOL_BYTES, local_buffer_bytes=16 * 2**20, kv_lease_ttl_ms=1000)
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    with KVPool.start(cfg, work) as kv:
        specs = [
            kv.configure(InstanceSpec(name=f"kv{i}", model=str(tiny_model), port=free_port(), cpus=c,
                                      max_model_len=4096, kv_cache_bytes=64 * 2**20, max_num_seqs=16))
            for i, c in enumerate(sets)
        ]
        with InstancePool.launch(specs, work, ready_timeout_s=600) as instances:
            yield PoolRig(kv, instances, Path(tiny_model), kv_bytes_per_token(tiny_model, "float32"))
