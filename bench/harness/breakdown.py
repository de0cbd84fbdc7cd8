"""Where a rollout's time goes: engine work, concurrency, re-admission, prefill, scheduler gaps.

Built from what a run already records (the driver's chunk events) plus two scrapes of every
instance's Prometheus /metrics (before and after the run), so it costs nothing while the run is
timed. Used by `bench.compare` (one breakdown per run, in compare.json and compare.md) and by
`python -m bench.harness.breakdown` (a single profiled rollout per policy).

Per instance and in total:

* busy: time with at least one of our chunks in flight; concurrency: mean chunks in flight
  while busy (the batch the scheduler gave the engine);
* engine steps and tokens per step (vLLM's `iteration_tokens_total`), hence time per step;
* prefill tokens computed vs served from the instance's prefix cache (`prompt_tokens_cached`),
  for chunks that stayed on their instance and for those that moved;
* vLLM queue time (admitted by us, waiting inside vLLM for KV or a batch slot) and preemptions;
* HTTP/API overhead: chunk latency seen by the client minus vLLM's own end-to-end latency;
* scheduler gap: between a request's chunk coming back and its next chunk being dispatched.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

from seer.procs.prometheus import parse_prometheus

# Counters and histogram sums/counts that the breakdown diffs between two scrapes.
_METRICS = (
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:iteration_tokens_total_sum",
    "vllm:iteration_tokens_total_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_inference_time_seconds_sum",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_prefill_kv_computed_tokens_sum",
)


def metric_totals(text: str) -> dict[str, float]:
    """The metrics above summed over their label sets (one engine per instance here)."""
    out = dict.fromkeys(_METRICS, 0.0)
    for name, _, value in parse_prometheus(text):
        if name in out:
            out[name] += value
    return out


async def scrape(clients: Sequence) -> dict[str, dict[str, float]]:
    texts = await asyncio.gather(*(c.metrics_text() for c in clients))
    return {c.name: metric_totals(t) for c, t in zip(clients, texts)}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def breakdown(chunks: Sequence, start: float, end: float, before: dict, after: dict) -> dict:
    """`chunks`: the run's ChunkEvents (driver clock); `before`/`after`: `scrape` results."""
    wall = end - start
    per: dict[str, dict] = {}
    by_inst: dict[str, list] = defaultdict(list)
    for c in chunks:
        by_inst[c.instance].append(c)
    for name in sorted(set(before) | set(by_inst)):
        mine = by_inst.get(name, [])
        d = {k: after.get(name, {}).get(k, 0.0) - before.get(name, {}).get(k, 0.0) for k in _METRICS}
        busy = _union_length([(c.dispatch_time, c.complete_time) for c in mine])
        inflight_s = sum(c.complete_time - c.dispatch_time for c in mine)
        steps = d["vllm:iteration_tokens_total_count"]
        client_s = sum(c.engine_finish_time - c.engine_start_time for c in mine if c.finish_reason != "error")
        stayed = [c for c in mine if c.chunk_index > 0 and not c.migrated]
        moved = [c for c in mine if c.migrated]
        per[name] = {
            "chunks": len(mine),
            "busy_s": busy,
            "idle_s": wall - busy,
            "concurrency": inflight_s / busy if busy else 0.0,
            "engine_steps": int(steps),
            "tokens_per_step": d["vllm:iteration_tokens_total_sum"] / steps if steps else 0.0,
            "ms_per_step": 1e3 * busy / steps if steps else 0.0,
            "generated_tokens": int(d["vllm:generation_tokens_total"]),
            "prompt_tokens": int(d["vllm:prompt_tokens_total"]),
            "prompt_tokens_cached": int(d["vllm:prompt_tokens_cached_total"]),
            "prefill_tokens_computed": int(d["vllm:prompt_tokens_total"] - d["vllm:prompt_tokens_cached_total"]),
            "stayed_chunks": len(stayed),
            "stayed_prefix_tokens": sum(c.prompt_tokens for c in stayed),
            "stayed_prefix_cached": sum(c.cached_prefix_tokens for c in stayed),
            "moved_chunks": len(moved),
            "moved_prefix_tokens": sum(c.prompt_tokens for c in moved),
            "moved_prefix_cached": sum(c.cached_prefix_tokens for c in moved),
            "preemptions": int(d["vllm:num_preemptions_total"]),
            "vllm_queue_s": d["vllm:request_queue_time_seconds_sum"],
            "vllm_prefill_s": d["vllm:request_prefill_time_seconds_sum"],
            "vllm_e2e_s": d["vllm:e2e_request_latency_seconds_sum"],
            "client_latency_s": client_s,
            # Per chunk: what the client waited beyond vLLM's own latency (HTTP, API server, JSON).
            "http_overhead_ms_per_chunk": 1e3 * (client_s - d["vllm:e2e_request_latency_seconds_sum"]) / len(mine)
            if mine else 0.0,
        }
    # Scheduler gaps: a request back in the buffer until its next chunk leaves.
    by_req: dict[str, list] = defaultdict(list)
    for c in chunks:
        if c.finish_reason != "error":
            by_req[c.request_id].append(c)
    gaps = []
    for evs in by_req.values():
        evs.sort(key=lambda c: c.chunk_index)
        gaps += [b.dispatch_time - a.complete_time for a, b in zip(evs, evs[1:])]
    gaps.sort()
    total = {
        "wall_s": wall,
        "longest_request": critical_path(chunks, start),
        "chunks": len(chunks),
        "requeued_chunks": len(gaps),
        "gap_mean_ms": 1e3 * sum(gaps) / len(gaps) if gaps else 0.0,
        "gap_p50_ms": 1e3 * gaps[len(gaps) // 2] if gaps else 0.0,
        "gap_p90_ms": 1e3 * gaps[int(len(gaps) * 0.9)] if gaps else 0.0,
        "gap_max_ms": 1e3 * gaps[-1] if gaps else 0.0,
        "busy_fraction": sum(p["busy_s"] for p in per.values()) / (wall * len(per)) if per and wall else 0.0,
    }
    for k in ("engine_steps", "generated_tokens", "prompt_tokens", "prompt_tokens_cached", "prefill_tokens_computed",
              "stayed_chunks", "stayed_prefix_tokens", "stayed_prefix_cached", "moved_chunks",
              "moved_prefix_tokens", "moved_prefix_cached", "preemptions", "vllm_queue_s", "vllm_prefill_s"):
        total[k] = sum(p[k] for p in per.values())
    n = sum(p["chunks"] for p in per.values())
    total["http_overhead_ms_per_chunk"] = (
        sum(p["http_overhead_ms_per_chunk"] * p["chunks"] for p in per.values()) / n if n else 0.0
    )
    return {"total": total, "instances": per}


def critical_path(chunks: Sequence, start: float) -> dict | None:
    """The request with the most tokens: when it started and ended, and where its time went.

    A rollout cannot end before its longest response has been decoded one token per step, so this
    is the lower bound every policy works against: its in-engine time, plus its wait before the
    first chunk, plus what each later chunk waited (in the buffer, and in HTTP/API round trips).
    """
    by_req: dict[str, list] = defaultdict(list)
    for c in chunks:
        if c.finish_reason != "error":
            by_req[c.request_id].append(c)
    if not by_req:
        return None
    rid, evs = max(by_req.items(), key=lambda kv: (sum(c.new_tokens for c in kv[1]), kv[0]))
    evs.sort(key=lambda c: c.chunk_index)
    gaps = [b.dispatch_time - a.complete_time for a, b in zip(evs, evs[1:])]
    in_flight = sum(c.complete_time - c.dispatch_time for c in evs)
    return {
        "request": rid,
        "tokens": sum(c.new_tokens for c in evs),
        "chunks": len(evs),
        "instances": sorted({c.instance for c in evs}),
        "first_dispatch_s": evs[0].dispatch_time - start,
        "finish_s": evs[-1].complete_time - start,
        "in_flight_s": in_flight,
        "between_chunks_s": sum(gaps),
        "ms_per_token_in_flight": 1e3 * in_flight / max(1, sum(c.new_tokens for c in evs)),
    }


def format_breakdown(name: str, b: dict) -> str:
    t = b["total"]
    lines = [
        f"{name}: wall {t['wall_s']:.1f} s, busy {t['busy_fraction']:.0%}, chunks {t['chunks']} "
        f"(requeued {t['requeued_chunks']}, gap mean {t['gap_mean_ms']:.0f} ms p50 {t['gap_p50_ms']:.0f} "
        f"p90 {t['gap_p90_ms']:.0f} max {t['gap_max_ms']:.0f}), preemptions {t['preemptions']}, "
        f"prefill computed {t['prefill_tokens_computed']} of {t['prompt_tokens']} prompt tokens; "
        f"stayed chunks {t['stayed_chunks']}: {t['stayed_prefix_cached']}/{t['stayed_prefix_tokens']} prefix cached; "
        f"moved {t['moved_chunks']}: {t['moved_prefix_cached']}/{t['moved_prefix_tokens']}; "
        f"vLLM queue {t['vllm_queue_s']:.1f} s; HTTP overhead {t['http_overhead_ms_per_chunk']:.1f} ms/chunk",
    ]
    if t.get("longest_request"):
        lr = t["longest_request"]
        lines.append(
            f"  longest request {lr['request']} ({lr['tokens']} tokens, {lr['chunks']} chunks on {lr['instances']}): "
            f"first dispatch {lr['first_dispatch_s']:.1f} s, done {lr['finish_s']:.1f} s, in flight {lr['in_flight_s']:.1f} s "
            f"({lr['ms_per_token_in_flight']:.1f} ms/token), between chunks {lr['between_chunks_s']:.1f} s"
        )
    for inst, p in b["instances"].items():
        lines.append(
            f"  {inst}: busy {p['busy_s']:.1f} s idle {p['idle_s']:.1f} s, concurrency {p['concurrency']:.1f}, "
            f"steps {p['engine_steps']} x {p['tokens_per_step']:.1f} tok, {p['ms_per_step']:.1f} ms/step, "
            f"generated {p['generated_tokens']}, prefill {p['prefill_tokens_computed']}, "
            f"preemptions {p['preemptions']}, vLLM queue {p['vllm_queue_s']:.1f} s"
        )
    return "\n".join(lines)
