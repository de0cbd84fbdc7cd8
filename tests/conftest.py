"""Session-wide real parts shared by every test that needs them (vLLM start-up costs a minute)."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

# Ray reads its auth settings when it is imported: before anything imports it, the session gets
# one token, used by the session's Ray clusters, this process and the seer-run jobs tests start.
RAY_TMP = Path(tempfile.mkdtemp(prefix="seer-t-", dir="/tmp"))  # short: Ray's socket paths live below
(RAY_TMP / "token").write_text(secrets.token_hex(32))
(RAY_TMP / "token").chmod(0o600)
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(RAY_TMP / "token"), RAY_USAGE_STATS_ENABLED="0")

# Fixtures that start real vLLM instances: a test using one is a `vllm` test (`make test-fast`
# leaves those out) whether or not its file says so.
VLLM_FIXTURES = {"vllm_pool", "rig", "dgds_vllm", "three_instances", "restore_base_weights"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The embedded tiny preset (built once into the cache, then reused)."""
    from seer.model import ensure_model

    return ensure_model("tiny", progress=False)


@pytest.fixture(scope="session")
def vllm_pool(tiny_model, tmp_path_factory):
    """Two real vLLM instances of the tiny model, one CPU core each when there are two."""
    from seer.fleet.instance import InstanceSpec
    from seer.procs import cpu_sets, free_port
    from seer.fleet.pool import InstancePool

    n = 2
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(n) if len(cores) >= n else [",".join(map(str, cores))] * n
    specs = [
        InstanceSpec(name=f"inst{i}", model=str(tiny_model), port=free_port(), cpus=c,
                     max_model_len=4096, kv_cache_bytes=64 * 2**20, max_num_seqs=128)
        for i, c in enumerate(sets)
    ]
    pool = InstancePool.launch(specs, tmp_path_factory.mktemp("vllm-logs"), ready_timeout_s=600)
    _warm_up(pool)
    yield pool
    pool.close()


def _warm_up(pool) -> None:
    """One short request per instance: an instance's first request pays seconds of kernel set-up,
    which would otherwise make whichever test first touches it look serialized."""
    import asyncio

    from seer.types import GenerateRequest, SamplingParams

    async def go():
        try:
            await asyncio.gather(*(c.generate(GenerateRequest(f"warmup-{c.name}", [1, 2, 3], 8, SamplingParams()))
                                   for c in pool.clients))
        finally:
            for c in pool.clients:
                await c.close()

    asyncio.run(go())


@pytest.fixture
def restore_base_weights(vllm_pool, tiny_model):
    """A test that trains on the shared instances leaves them as it found them: base weights,
    version 0, empty prefix caches."""
    yield
    import asyncio

    from seer.fleet.weights import push_weights

    async def go():
        try:
            await push_weights(vllm_pool.clients, str(tiny_model), 0)
        finally:
            for c in vllm_pool.clients:
                await c.close()

    asyncio.run(go())


@pytest.fixture(scope="session")
def ray_session():
    """A one-node Ray on 127.0.0.2 that this process is connected to, started as seer-run starts its
    own; Fleet.launch in a test uses it instead of starting one per test."""
    from seer.fleet.config import ClusterConfig
    from seer.fleet.ray_cluster import RayCluster

    cluster = RayCluster.connect(ClusterConfig(), RAY_TMP)  # seer-run's own way: a guarded `ray start`
    yield cluster
    cluster.close()


def pytest_unconfigure(config):
    shutil.rmtree(RAY_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_two_nodes():
    """A real two-node Ray cluster: head 127.0.0.3 on core 0, a node 127.0.0.4 on core 1, each its
    own `ray start` (tests.ray_nodes). Jobs join it with cluster.address; a test that loses a node
    brings it back (`RayNodes.revive`)."""
    from bench.harness.ray_nodes import RayNodes

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.fail("the two-node cluster needs two cores, one per node")
    nodes = RayNodes(RAY_TMP / "two").start(["127.0.0.3", "127.0.0.4"], [str(cores[0]), str(cores[1])])
    yield nodes
    nodes.stop()
