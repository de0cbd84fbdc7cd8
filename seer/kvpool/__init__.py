"""Global KV pool: a Mooncake store shared by every vLLM instance, so a chunk that moves to
another instance loads its prefix instead of re-prefilling it.

Entry points: `KVPoolConfig` (the run config's `kvpool:` section), `KVPool.start(...)` (launch
or join the pool; `configure(spec)` adds the connector flags to an InstanceSpec), and
`PoolCounters` / `usage_between` / `generate_measured` (prefix tokens from the pool vs
recomputed, and bytes moved, from vLLM's own counters).
"""

from seer.kvpool.accounting import MasterStats, PoolCounters, PoolUsage, kv_bytes_per_token, usage_between
from seer.kvpool.config import KVPoolConfig
from seer.kvpool.connector import BLOCK_TOKENS, InstancePoolSettings, cache_prefix, instance_settings
from seer.kvpool.measure import MeasuredChunk, generate_measured
from seer.kvpool.pool import KVPool
from seer.kvpool.processes import PoolEndpoints, PoolStartError

__all__ = [
    "BLOCK_TOKENS",
    "InstancePoolSettings",
    "KVPool",
    "KVPoolConfig",
    "MasterStats",
    "MeasuredChunk",
    "PoolCounters",
    "PoolEndpoints",
    "PoolStartError",
    "PoolUsage",
    "cache_prefix",
    "generate_measured",
    "instance_settings",
    "kv_bytes_per_token",
    "usage_between",
]
