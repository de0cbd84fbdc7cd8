"""Measure what the pool saves: one migrated prefill loaded from the pool vs recomputed.

Launches a pool and two instances (one core each), then per repeat: instance A prefills a
fresh random context (its KV goes to the pool); instance B, with its local prefix cache
dropped, serves the same context (prefix loaded from the pool); then, with the pool cleared
too, B serves it again (everything recomputed). Prints and optionally writes the numbers that
docs/kvpool.md quotes.

    python -m bench.kvpool_prefill --preset tiny --context 3073 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from pathlib import Path

from seer.kvpool.accounting import kv_bytes_per_token
from seer.kvpool.config import KVPoolConfig
from seer.fleet.measure import generate_measured
from seer.kvpool.pool import KVPool
from seer.fleet.instance import InstanceSpec
from seer.procs import free_port
from seer.fleet.pool import InstancePool
from seer.types import GenerateRequest, SamplingParams


async def _measure(pool: InstancePool, context: int, repeats: int, kvb: int, vocab: int) -> list[dict]:
    a, b = pool.clients
    sp = SamplingParams(temperature=0.0)
    rows = []
    for r in range(repeats):
        rng = random.Random(r)
        prompt = [rng.randrange(3, vocab) for _ in range(context)]
        await a.generate(GenerateRequest(f"bench-a-{r}", prompt, 1, sp))
        await asyncio.sleep(0.5)  # the connector stores asynchronously after the step
        await b.reset_prefix_cache()
        hit = await generate_measured(b, GenerateRequest(f"bench-pool-{r}", prompt, 1, sp), kvb)
        await b.reset_prefix_cache(external=True)  # clears the pool as well
        miss = await generate_measured(b, GenerateRequest(f"bench-miss-{r}", prompt, 1, sp), kvb)
        assert hit.result.token_ids == miss.result.token_ids
        rows.append({
            "context_tokens": context,
            "pool_tokens_from_pool": hit.usage.tokens_from_pool,
            "pool_tokens_recomputed": hit.usage.tokens_recomputed,
            "pool_bytes_loaded": hit.usage.bytes_loaded,
            "pool_prefill_s": round(hit.wall_s, 4),
            "recompute_tokens": miss.usage.tokens_recomputed,
            "recompute_prefill_s": round(miss.wall_s, 4),
        })
    for c in pool.clients:
        await c.close()
    return rows


def _random_model(like: str, hidden: int, layers: int, heads: int, kv_heads: int) -> str:
    """A random-weight copy of `like` (same tokenizer) with other dims, in a temp dir."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(like)
    cfg.hidden_size, cfg.num_hidden_layers = hidden, layers
    cfg.num_attention_heads, cfg.num_key_value_heads = heads, kv_heads
    cfg.intermediate_size = 3 * hidden
    cfg.layer_types = ["full_attention"] * layers
    out = Path(tempfile.mkdtemp(prefix="seer-kvpool-bench-model-"))
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    for f in Path(like).iterdir():
        if f.name.startswith("tokenizer") or f.name == "generation_config.json":
            shutil.copy(f, out / f.name)
    return str(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="the embedded model preset")
    ap.add_argument("--model", help="a local HF checkpoint instead of the embedded preset")
    ap.add_argument("--random-dims", metavar="HIDDEN,LAYERS,HEADS,KV_HEADS",
                    help="time a random-weight Qwen2 of these dims (prefill time does not depend on weights)")
    ap.add_argument("--context", type=int, default=3073, help="tokens of the random context that is prefilled, migrated and recomputed")
    ap.add_argument("--repeats", type=int, default=3, help="measurements of each case")
    ap.add_argument("--kv-cache-bytes", type=int, default=256 * 2**20, help="KV memory per instance, in bytes")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)

    from seer.model import ensure_model

    model = args.model or str(ensure_model(args.preset, progress=False))
    if args.random_dims:
        model = _random_model(model, *(int(x) for x in args.random_dims.split(",")))
    vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
    kvb = kv_bytes_per_token(model, "float32")
    work = Path(tempfile.mkdtemp(prefix="seer-kvpool-bench-"))
    with KVPool.start(KVPoolConfig(capacity_bytes=1024 * 2**20, local_buffer_bytes=64 * 2**20), work) as kv:
        specs = [
            kv.configure(InstanceSpec(f"b{i}", model, free_port(), cpus=str(i), kv_cache_bytes=args.kv_cache_bytes,
                                      max_model_len=max(4096, args.context + 16), max_num_seqs=16))
            for i in range(2)
        ]
        with InstancePool.launch(specs, work) as pool:
            rows = asyncio.run(_measure(pool, args.context, args.repeats, kvb, min(vocab, 120)))
    summary = {
        "model": model,
        "kv_bytes_per_token": kvb,
        "rows": rows,
        "median_pool_prefill_s": statistics.median(r["pool_prefill_s"] for r in rows),
        "median_recompute_prefill_s": statistics.median(r["recompute_prefill_s"] for r in rows),
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
