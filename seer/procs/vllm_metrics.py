"""A vLLM instance's Prometheus /metrics text as the records Seer reads: a Telemetry snapshot, and
its speculative-decoding counters (acceptance is judged by the engine's numbers, not the proposer's).

Schedulers place work by free KV memory and queue depth; vLLM already exports both, so we
read them rather than instrumenting the engine.
"""

from __future__ import annotations

import time

from seer.procs.prometheus import parse_prometheus
from seer.types import SpecDecodeCounters, Telemetry

def _sum(samples, name: str, **match: str) -> float:
    return sum(
        v for n, lab, v in samples if n == name and all(lab.get(k) == want for k, want in match.items())
    )


def kv_capacity_tokens(samples) -> int:
    """KV slots of the instance, from cache_config_info's labels (0 when not exported)."""
    for name, labels, _ in samples:
        if name == "vllm:cache_config_info":
            if labels.get("kv_cache_size_tokens", "None") not in ("None", ""):
                return int(float(labels["kv_cache_size_tokens"]))
            blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
            if blocks not in (None, "None") and size not in (None, "None"):
                return int(blocks) * int(size)
    return 0


def kv_block_size(samples) -> int:
    """Tokens per KV block (cache_config_info's block_size label; 0 when not exported). vLLM's CPU
    backend defaults to 128, GPUs to 16: a scheduler that reserves KV must round to this."""
    for name, labels, _ in samples:
        if name == "vllm:cache_config_info" and labels.get("block_size") not in (None, "None", ""):
            return int(float(labels["block_size"]))
    return 0


# What Telemetry reads. vLLM's /metrics is mostly histogram buckets, and parsing all of it on every
# sample is time the driver's event loop cannot dispatch chunks in (docs/bench.md, "Driver
# overhead"): lines of other metrics are skipped before the regex.
_TELEMETRY_METRICS = (
    "vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:num_preemptions_total", "vllm:spec_decode_num_",
    "vllm:prefix_cache_", "vllm:external_prefix_cache_",
)


def telemetry_from_metrics(instance: str, text: str, now: float | None = None) -> Telemetry:
    s = parse_prometheus(text, _TELEMETRY_METRICS)
    return Telemetry(
        instance=instance,
        time=time.monotonic() if now is None else now,
        kv_usage=_sum(s, "vllm:kv_cache_usage_perc"),
        kv_capacity_tokens=kv_capacity_tokens(s),
        num_running=int(_sum(s, "vllm:num_requests_running")),
        num_waiting=int(_sum(s, "vllm:num_requests_waiting")),
        preemptions_total=int(_sum(s, "vllm:num_preemptions_total")),
        spec_num_drafts=int(_sum(s, "vllm:spec_decode_num_drafts_total")),
        spec_num_draft_tokens=int(_sum(s, "vllm:spec_decode_num_draft_tokens_total")),
        spec_num_accepted_tokens=int(_sum(s, "vllm:spec_decode_num_accepted_tokens_total")),
        prefix_cache_queries=int(_sum(s, "vllm:prefix_cache_queries_total")),
        prefix_cache_hits=int(_sum(s, "vllm:prefix_cache_hits_total")),
        external_prefix_cache_queries=int(_sum(s, "vllm:external_prefix_cache_queries_total")),
        external_prefix_cache_hits=int(_sum(s, "vllm:external_prefix_cache_hits_total")),
        block_size=kv_block_size(s),
    )


def spec_decode_counters(text: str) -> SpecDecodeCounters:
    """The engine's draft counters (summed over engines); a phase is the difference of two readings."""
    return telemetry_from_metrics("", text).spec
