"""The pool's settings without processes: config checks, instance flags, counter parsing."""

from __future__ import annotations

import json

import pytest

from seer.config import ConfigError, build
from seer.kvpool import (
    KVPoolConfig,
    PoolCounters,
    PoolEndpoints,
    cache_prefix,
    instance_settings,
    kv_bytes_per_token,
    usage_between,
)
from seer.kvpool.accounting import MasterStats
from seer.fleet.instance import InstanceSpec


def test_config_rejects_what_cannot_work():
    with pytest.raises(ValueError, match="metadata_server"):
        KVPoolConfig(master_address="10.0.0.1:50051")
    with pytest.raises(ValueError, match="host:port"):
        KVPoolConfig(master_address="10.0.0.1", metadata_server="http://x/metadata")
    with pytest.raises(ValueError, match="capacity_bytes"):
        KVPoolConfig(capacity_bytes=0)  # launching a pool with no memory
    with pytest.raises(ValueError, match="eviction_high_watermark"):
        KVPoolConfig(eviction_high_watermark=1.5)
    with pytest.raises(ValueError, match="minimum segment"):
        KVPoolConfig(capacity_bytes=8 * 2**20)
    with pytest.raises(ConfigError, match="kvpool.capacity"):
        build(KVPoolConfig, {"capacity": 1}, "kvpool")
    joined = build(
        KVPoolConfig,
        {"master_address": "10.0.0.1:50051", "metadata_server": "http://10.0.0.1:8080/metadata", "capacity_bytes": 0},
        "kvpool",
    )
    assert not joined.launches_master


def test_instance_settings_carry_the_cpu_recipe(tmp_path):
    cfg = KVPoolConfig(local_buffer_bytes=32 * 2**20)
    ep = PoolEndpoints("127.0.0.1:5000", "http://127.0.0.1:5001/metadata")
    spec = InstanceSpec(name="a", model="/models/m", port=4321, extra_args=("--foo",), env={"X": "1"})
    s = instance_settings(cfg, ep, spec, tmp_path)
    mc = json.loads(open(s.config_path).read())
    assert mc["mode"] == "standalone-store" and mc["global_segment_size"] == 0
    assert mc["master_server_address"] == "127.0.0.1:5000" and mc["protocol"] == "tcp"
    assert mc["local_buffer_size"] == 32 * 2**20
    flag = s.extra_args.index("--kv-transfer-config")
    ktc = json.loads(s.extra_args[flag + 1])
    assert ktc["kv_connector"] == "MooncakeStoreConnector" and ktc["kv_role"] == "kv_both"
    extra = ktc["kv_connector_extra_config"]
    assert extra["save_decode_cache"] is True and extra["lookup_rpc_port"] == 4321
    assert extra["cache_prefix"] == cache_prefix("/models/m", "float32")
    assert s.env["MOONCAKE_CONFIG_PATH"] == s.config_path and s.env["MC_TCP_BIND_ADDRESS"] == "127.0.0.1"
    applied = s.apply(spec)
    assert applied.extra_args[0] == "--foo" and "--kv-transfer-config" in applied.command()
    assert applied.env["X"] == "1" and applied.environment()["MOONCAKE_CONFIG_PATH"] == s.config_path


def test_cache_prefix_separates_models_and_dtypes():
    assert cache_prefix("/m/a", "float32") != cache_prefix("/m/a", "bfloat16")
    assert cache_prefix("/m/a", "float32") != cache_prefix("/n/a", "float32")
    assert cache_prefix("/m/a", "float32") == cache_prefix("/m/a", "float32")


def test_kv_bytes_per_token_of_the_tiny_model(tiny_model):
    # 2 layers x 1 kv head x head_dim 32 x (K, V) x 4 bytes
    assert kv_bytes_per_token(tiny_model, "float32") == 2 * 1 * 32 * 2 * 4
    assert kv_bytes_per_token(tiny_model, "bfloat16") == 256


METRICS = """
vllm:prompt_tokens_by_source_total{{engine="0",source="local_compute"}} {computed}
vllm:prompt_tokens_by_source_total{{engine="0",source="local_cache_hit"}} {local}
vllm:prompt_tokens_by_source_total{{engine="0",source="external_kv_transfer"}} {pool}
vllm:mooncake_store_operation_bytes_total{{engine="0",operation="load_get",status="ok"}} {loaded}
vllm:mooncake_store_operation_bytes_total{{engine="0",operation="save_put",status="ok"}} 100.0
vllm:mooncake_store_operation_bytes_total{{engine="0",operation="save_put",status="error"}} {failed_bytes}
vllm:mooncake_store_operation_failed_keys_total{{engine="0",operation="save_put",status="error"}} {failed}
"""


def test_usage_is_a_difference_of_counters_and_ignores_failed_transfers():
    a = PoolCounters.from_metrics(METRICS.format(computed=10, local=0, pool=0, loaded=0, failed_bytes=0, failed=0))
    b = PoolCounters.from_metrics(METRICS.format(computed=11, local=128, pool=256, loaded=131072, failed_bytes=9999, failed=2))
    u = usage_between(a, b)
    assert (u.tokens_from_pool, u.tokens_local_hit, u.tokens_recomputed) == (256, 128, 1)
    assert u.bytes_loaded == 131072 and u.bytes_saved == 0 and u.failed_keys == 2
    assert not u.bytes_estimated and u.prompt_tokens == 385
    assert u.pool_fraction == 256 / 257


def test_bytes_are_estimated_only_without_connector_counters():
    plain = "vllm:prompt_tokens_by_source_total{source=\"external_kv_transfer\"} 384\n"
    u = usage_between(PoolCounters(), PoolCounters.from_metrics(plain), kv_bytes_per_token=512)
    assert u.bytes_estimated and u.bytes_loaded == 384 * 512
    with pytest.raises(ValueError):
        usage_between(PoolCounters(), PoolCounters.from_metrics(plain))


def test_master_stats_parse():
    text = "master_total_capacity_bytes 8388608\nmaster_allocated_bytes 65536\nmaster_key_count 1\nmaster_evicted_key_count 3\n"
    s = MasterStats.from_metrics(text)
    assert (s.capacity_bytes, s.allocated_bytes, s.keys, s.evicted_keys) == (8388608, 65536, 1, 3)
