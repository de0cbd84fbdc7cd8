"""What one vLLM instance needs to use the pool: its Mooncake JSON, CLI flags and environment.

vLLM's built-in MooncakeStoreConnector reads its Mooncake settings from the JSON file named by
MOONCAKE_CONFIG_PATH and its vLLM-side settings from --kv-transfer-config. The details below
are the ones found necessary on the CPU build (vLLM 0.32, non-CUDA Mooncake, TCP):
- `mode: standalone-store` with `global_segment_size: 0`: instances only read and write, the
  standalone store holds the memory, so KV survives an instance exiting;
- `save_decode_cache: true`, or the KV of generated tokens is never stored;
- a `cache_prefix` per model and dtype, since keys carry neither (two runs of different models
  or dtypes sharing a master must not read each other's KV);
- a distinct `lookup_rpc_port` per instance: it names the scheduler-to-worker lookup IPC socket,
  which is otherwise the same path for every instance on a host;
- MC_TCP_BIND_ADDRESS and MOONCAKE_REQUESTER_LOCAL_HOSTNAME pin the transfer engine to the
  instance's node address instead of whatever interface get_ip() picks;
- `kv_load_failure_policy: recompute`, so a prefix held by a lost store costs re-prefill, not the request.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from seer.kvpool.config import KVPoolConfig
from seer.kvpool.processes import PoolEndpoints
from seer.types import LaunchSpec

CONNECTOR = "MooncakeStoreConnector"
BLOCK_TOKENS = 128  # the connector stores whole blocks of this many tokens (vLLM CPU block size)


@dataclass(frozen=True)
class InstancePoolSettings:
    """The pool part of one instance's launch: pass to LaunchSpec.extra_args / env."""

    extra_args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    config_path: str = ""  # the Mooncake JSON it was written to
    kv_transfer_config: dict = field(default_factory=dict)

    def apply(self, spec: LaunchSpec) -> LaunchSpec:
        """The spec with these flags and env added (the spec's own entries win on env clashes)."""
        return replace(spec, extra_args=(*spec.extra_args, *self.extra_args), env={**self.env, **spec.env})


def cache_prefix(model: str, dtype: str) -> str:
    """A key namespace that differs for different models or dtypes: readable name + path hash."""
    path = str(Path(model).expanduser().resolve()) if Path(model).expanduser().exists() else model
    digest = hashlib.sha1(f"{path}|{dtype}".encode()).hexdigest()[:10]
    name = Path(model.rstrip("/")).name or "model"
    return f"{name}-{dtype}-{digest}"


def mooncake_json(cfg: KVPoolConfig, endpoints: PoolEndpoints) -> dict:
    return {
        "metadata_server": endpoints.metadata_server,
        "master_server_address": endpoints.master_address,
        "protocol": cfg.protocol,
        "device_name": cfg.device_name,
        "mode": "standalone-store",
        "global_segment_size": 0,
        "local_buffer_size": int(cfg.local_buffer_bytes),
    }


def instance_settings(
    cfg: KVPoolConfig,
    endpoints: PoolEndpoints,
    spec: LaunchSpec,
    config_dir: Path,
) -> InstancePoolSettings:
    """Write `config_dir/<instance>.mooncake.json` and return the flags and env for `spec`."""
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / f"{spec.name}.mooncake.json"
    path.write_text(json.dumps(mooncake_json(cfg, endpoints), indent=2))
    extra = {
        "save_decode_cache": bool(cfg.save_decode_cache),
        "cache_prefix": cfg.cache_prefix or cache_prefix(spec.model, spec.dtype),
        "lookup_rpc_port": int(spec.port),
    }
    # A prefix the pool lists but cannot deliver (its store was lost with its node) is recomputed,
    # not the request failed: vLLM's default for a failed KV load is "fail".
    ktc = {"kv_connector": CONNECTOR, "kv_role": "kv_both", "kv_connector_extra_config": extra,
           "kv_load_failure_policy": "recompute"}
    env = {
        "MOONCAKE_CONFIG_PATH": str(path),
        "MC_TCP_BIND_ADDRESS": cfg.host,
        "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": cfg.host,
        "VLLM_SERVER_DEV_MODE": "1",  # exposes POST /reset_prefix_cache?reset_external=true
    }
    return InstancePoolSettings(
        extra_args=("--kv-transfer-config", json.dumps(ktc, separators=(",", ":"))),
        env=env,
        config_path=str(path),
        kv_transfer_config=ktc,
    )
