"""How much prefix came from the pool, how much was recomputed, and how many bytes moved.

The numbers come from vLLM's own Prometheus counters, diffed around a chunk (or an iteration):
- `vllm:prompt_tokens_by_source_total{source=external_kv_transfer|local_cache_hit|local_compute}`
  splits every prompt token by where its KV came from;
- `vllm:mooncake_store_operation_bytes_total{operation=load_get|save_put}` counts the bytes the
  MooncakeStoreConnector read from / wrote to the pool (vLLM 0.32 exports them; when a build
  does not, bytes are estimated as tokens x per-token KV bytes and flagged `bytes_estimated`).
A per-chunk diff is exact only while the instance serves that chunk alone; under concurrency,
diff per iteration and use the per-request `usage.prompt_tokens_details.cached_tokens`
(local + pool together) for single chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from seer.procs.prometheus import parse_prometheus

DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp16": 2, "bf16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def kv_bytes_per_token(model_dir: str | Path, dtype: str = "float32") -> int:
    """KV bytes one token occupies: layers x kv_heads x head_dim x 2 (K and V) x dtype size."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    return layers * kv_heads * head_dim * 2 * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class PoolCounters:
    """One instance's cumulative prefix and transfer counters at one moment."""

    prompt_tokens_from_pool: int = 0  # external_kv_transfer
    prompt_tokens_local_hit: int = 0
    prompt_tokens_computed: int = 0
    external_queries: int = 0  # tokens looked up in the pool
    external_hits: int = 0
    bytes_loaded: int = 0  # load_get
    bytes_saved: int = 0  # save_put
    failed_keys: int = 0  # keys any pool operation failed on (e.g. master down, pool full)
    has_byte_counters: bool = False

    @classmethod
    def from_metrics(cls, text: str) -> PoolCounters:
        by_source: dict[str, float] = {}
        ext_q = ext_h = loaded = saved = failed = 0.0
        has_bytes = False
        for name, labels, value in parse_prometheus(text):
            if name == "vllm:prompt_tokens_by_source_total":
                by_source[labels.get("source", "")] = by_source.get(labels.get("source", ""), 0.0) + value
            elif name == "vllm:external_prefix_cache_queries_total":
                ext_q += value
            elif name == "vllm:external_prefix_cache_hits_total":
                ext_h += value
            elif name == "vllm:mooncake_store_operation_bytes_total":
                has_bytes = True
                if labels.get("status") != "ok":  # a failed put still reports the bytes it tried
                    continue
                if labels.get("operation") == "load_get":
                    loaded += value
                elif labels.get("operation") == "save_put":
                    saved += value
            elif name == "vllm:mooncake_store_operation_failed_keys_total":
                failed += value
        return cls(
            prompt_tokens_from_pool=int(by_source.get("external_kv_transfer", 0)),
            prompt_tokens_local_hit=int(by_source.get("local_cache_hit", 0)),
            prompt_tokens_computed=int(by_source.get("local_compute", 0)),
            external_queries=int(ext_q),
            external_hits=int(ext_h),
            bytes_loaded=int(loaded),
            bytes_saved=int(saved),
            failed_keys=int(failed),
            has_byte_counters=has_bytes,
        )


@dataclass(frozen=True)
class PoolUsage:
    """What one chunk (or iteration) took from the pool: a difference of two PoolCounters."""

    tokens_from_pool: int
    tokens_local_hit: int
    tokens_recomputed: int
    bytes_loaded: int
    bytes_saved: int
    failed_keys: int
    bytes_estimated: bool  # True: bytes are tokens x kv_bytes_per_token, not the connector's count

    @property
    def prompt_tokens(self) -> int:
        return self.tokens_from_pool + self.tokens_local_hit + self.tokens_recomputed

    @property
    def pool_fraction(self) -> float:
        """Share of the prefix that was not already on this instance that came from the pool."""
        remote = self.tokens_from_pool + self.tokens_recomputed
        return self.tokens_from_pool / remote if remote else 0.0

    def __add__(self, other: PoolUsage) -> PoolUsage:
        return PoolUsage(
            self.tokens_from_pool + other.tokens_from_pool,
            self.tokens_local_hit + other.tokens_local_hit,
            self.tokens_recomputed + other.tokens_recomputed,
            self.bytes_loaded + other.bytes_loaded,
            self.bytes_saved + other.bytes_saved,
            self.failed_keys + other.failed_keys,
            self.bytes_estimated or other.bytes_estimated,
        )


def usage_between(before: PoolCounters, after: PoolCounters, kv_bytes_per_token: int | None = None) -> PoolUsage:
    """after - before; bytes estimated from tokens when the connector exports no byte counters."""
    pool = after.prompt_tokens_from_pool - before.prompt_tokens_from_pool
    estimated = not after.has_byte_counters
    if estimated:
        if kv_bytes_per_token is None:
            raise ValueError("no Mooncake byte counters exported: pass kv_bytes_per_token to estimate bytes")
        loaded, saved = pool * kv_bytes_per_token, 0
    else:
        loaded, saved = after.bytes_loaded - before.bytes_loaded, after.bytes_saved - before.bytes_saved
    return PoolUsage(
        tokens_from_pool=pool,
        tokens_local_hit=after.prompt_tokens_local_hit - before.prompt_tokens_local_hit,
        tokens_recomputed=after.prompt_tokens_computed - before.prompt_tokens_computed,
        bytes_loaded=loaded,
        bytes_saved=saved,
        failed_keys=after.failed_keys - before.failed_keys,
        bytes_estimated=estimated,
    )


@dataclass(frozen=True)
class MasterStats:
    """The pool as mooncake_master sees it: fill level, objects, evictions, refused puts."""

    capacity_bytes: int
    allocated_bytes: int
    keys: int
    evicted_keys: int
    evicted_bytes: int
    put_start_failures: int

    @classmethod
    def from_metrics(cls, text: str) -> MasterStats:
        values: dict[str, float] = {}
        for name, _labels, value in parse_prometheus(text):
            if name.startswith("master_"):
                values[name] = values.get(name, 0.0) + value
        return cls(
            capacity_bytes=int(values.get("master_total_capacity_bytes", 0)),
            allocated_bytes=int(values.get("master_allocated_bytes", 0)),
            keys=int(values.get("master_key_count", 0)),
            evicted_keys=int(values.get("master_evicted_key_count", 0)),
            evicted_bytes=int(values.get("master_evicted_size_bytes", 0)),
            put_start_failures=int(values.get("master_put_start_failures_total", 0))
            + int(values.get("master_batch_put_start_failed_items_total", 0)),
        )
