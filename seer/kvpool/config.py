"""The `kvpool:` section of a run config: where the global KV pool lives and how it behaves.

Seer keeps every active request's KV cache in a Mooncake store shared by all vLLM instances, so
a chunk that moves to another instance loads its prefix instead of re-prefilling it. These
settings choose between launching the pool here (a `mooncake_master` plus one standalone
`mooncake_client` holding the pool's memory) and joining an existing master, and expose the
capacity and eviction knobs that `mooncake_master` actually has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MiB = 2**20
MIN_SEGMENT_BYTES = 16 * MiB  # mooncake_client refuses a smaller global segment


@dataclass(frozen=True)
class KVPoolConfig:
    enabled: bool = True  # the Mooncake KV pool: migrated chunks load their prefix instead of re-prefilling
    # None: launch mooncake_master here (127.0.0.1, free ports). "host:port": join that master.
    master_address: str | None = None
    # HTTP metadata server URL of an existing master, e.g. "http://10.0.0.1:8080/metadata".
    # Required with master_address; derived when the master is launched here.
    metadata_server: str | None = None
    host: str = "127.0.0.1"  # address every launched process and transfer engine binds to
    # Memory of the pool: the global segment of the standalone mooncake_client launched here.
    # 0 launches no store (an existing cluster already provides the memory).
    capacity_bytes: int = 4096 * MiB
    # Per-instance staging buffer Mooncake registers for transfers (must be > 0).
    local_buffer_bytes: int = 64 * MiB
    protocol: Literal["tcp", "rdma"] = "tcp"  # Mooncake transfer protocol
    device_name: str = ""  # RDMA NIC names for protocol "rdma"; unused on tcp
    # Eviction (mooncake_master): start evicting when the pool is this full, and evict this
    # share of objects each time. A full pool then drops old prefixes: those chunks re-prefill.
    eviction_high_watermark: float = 0.9
    eviction_ratio: float = 0.05  # share of objects evicted each time the high watermark is reached
    # How long (ms) an object read is protected from eviction (mooncake_master default_kv_lease_ttl).
    kv_lease_ttl_ms: int = 10_000
    # Seconds a store client stays alive without heartbeat before the master unmounts its memory.
    client_ttl_s: int = 10
    # Store KV of generated tokens too, not only of prompts: without it a chunk's own output
    # would have to be recomputed by the next chunk, which defeats divided rollout.
    save_decode_cache: bool = True
    # Keys carry neither dtype nor the model's full path; None derives a prefix from both.
    cache_prefix: str | None = None
    ready_timeout_s: float = 60.0  # how long the launched master and store may take to start

    def __post_init__(self) -> None:
        if self.master_address is not None and not self.metadata_server:
            raise ValueError("kvpool.metadata_server is required with kvpool.master_address")
        if self.master_address is not None and ":" not in self.master_address:
            raise ValueError(f"kvpool.master_address must be host:port, got {self.master_address!r}")
        if self.capacity_bytes < 0:
            raise ValueError("kvpool.capacity_bytes must be >= 0")
        if self.master_address is None and self.enabled and self.capacity_bytes == 0:
            raise ValueError("kvpool.capacity_bytes must be > 0 when the pool is launched here")
        if 0 < self.capacity_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"kvpool.capacity_bytes must be 0 or >= {MIN_SEGMENT_BYTES} (Mooncake's minimum segment)")
        if self.local_buffer_bytes <= 0:
            raise ValueError("kvpool.local_buffer_bytes must be > 0")
        if not 0 < self.eviction_high_watermark <= 1:
            raise ValueError("kvpool.eviction_high_watermark must be in (0, 1]")
        if not 0 < self.eviction_ratio <= 1:
            raise ValueError("kvpool.eviction_ratio must be in (0, 1]")
        if self.kv_lease_ttl_ms < 0 or self.client_ttl_s <= 0:
            raise ValueError("kvpool.kv_lease_ttl_ms must be >= 0 and kvpool.client_ttl_s > 0")
        if self.protocol not in ("tcp", "rdma"):
            raise ValueError(f"kvpool.protocol must be tcp or rdma, got {self.protocol!r}")

    @property
    def launches_master(self) -> bool:
        return self.master_address is None
