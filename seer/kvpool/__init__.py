"""Global KV pool: a Mooncake store shared by every vLLM instance, so a chunk that moves to
another instance loads its prefix instead of re-prefilling it.

Entry points: `KVPoolConfig` (the run config's `kvpool:` section), `KVPool.start(...)` (launch
or join the pool; `configure(spec)` adds the connector flags to an instance's launch record), and
`PoolCounters` / `usage_between` (prefix tokens from the pool vs recomputed, and bytes moved,
from vLLM's own counters; seer.fleet.measure brackets one chunk with them). Names that need Mooncake or HTTP load
on first use, so `seer.kvpool.config` imports without them.
"""

import importlib

_WHERE = {
    "MasterStats": "accounting", "PoolCounters": "accounting", "PoolUsage": "accounting",
    "kv_bytes_per_token": "accounting", "usage_between": "accounting",
    "KVPoolConfig": "config",
    "BLOCK_TOKENS": "connector", "InstancePoolSettings": "connector", "cache_prefix": "connector",
    "instance_settings": "connector",
    "KVPool": "pool",
    "PoolEndpoints": "processes", "PoolStartError": "processes",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'seer.kvpool' has no attribute {name!r}")
    return getattr(importlib.import_module(f"seer.kvpool.{_WHERE[name]}"), name)
