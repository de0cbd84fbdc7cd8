"""What routing replay's capture costs (docs/models.md, "Routing replay (R3)").

Starts two instances of the tiny random Qwen3-MoE (tests/routing/checkpoint.py), one core each:
A as seer-run launches instances today (vLLM's compiled model, no capture), B with `--enforce-eager`
(the capture hooks are Python in the forward pass). The same batch of greedy requests runs on A,
on B with capture off, and on B with capture on; per step, the recorder's own time inside the
worker (copying the ids, filing them by request) comes from its counters. Also measured: the bytes
and time of taking each request's routing back, and how many router decisions differ from
transformers' router on the same weights and tokens (in float32 like vLLM, and in bfloat16).

    python -m bench.routing_capture --requests 16 --prompt 200 --tokens 128 --out bench/results/routing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.routing.checkpoint

from seer.fleet.instance import InstanceSpec  # noqa: E402
from seer.fleet.pool import InstancePool  # noqa: E402
from seer.procs import cpu_sets, free_port  # noqa: E402
from seer.types import GenerateRequest, SamplingParams  # noqa: E402


async def _batch(client, prompts, tokens: int, tag: str):
    sp = SamplingParams(temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(client.generate(GenerateRequest(f"{tag}-{i}", p, tokens, sp))
                                     for i, p in enumerate(prompts)))
    return time.perf_counter() - t0, results


async def _stats(client) -> dict:
    out = await client._rpc("seer_routing_stats")
    return json.loads(out[0]) if out and out[0] != "null" else {}


def _disagreement(model_dir: str, results, prompts, dtype: str = "float32") -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    decisions = differ = tokens_any = ntok = 0
    for p, r in zip(prompts, results):
        seq = [*p, *r.token_ids]
        with torch.no_grad():
            logits = model(torch.tensor([seq]), output_router_logits=True).router_logits
        k = r.routing.top_k
        hf = np.stack([lg.float().topk(k, dim=-1).indices.numpy() for lg in logits], axis=1)[r.routing_start: len(seq) - 1]
        got = np.frombuffer(r.routing.data, np.uint8).reshape(-1, r.routing.layers, k)[: len(hf)]
        same = (np.sort(got, -1) == np.sort(hf, -1)).all(-1)
        decisions += same.size
        differ += int((~same).sum())
        tokens_any += int((~same.all(-1)).sum())
        ntok += same.shape[0]
    return {"router_decisions": decisions, "decisions_differing": differ,
            "decision_disagreement_rate": differ / decisions, "tokens": ntok,
            "tokens_differing_in_any_layer": tokens_any}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16, help="requests per batch, run at once")
    ap.add_argument("--prompt", type=int, default=200, help="random prompt tokens per request")
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens generated per request")
    ap.add_argument("--repeats", type=int, default=3, help="batches per configuration (fresh prompts each)")
    ap.add_argument("--out", default=None, help="folder to write capture.json into (printed only without it)")
    args = ap.parse_args(argv)
    from tests.routing.checkpoint import build_tiny_moe

    work = Path(tempfile.mkdtemp(prefix="seer-routing-bench-"))
    model = str(build_tiny_moe(work / "moe"))
    rng = np.random.default_rng(0)
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    specs = [InstanceSpec(name=n, model=model, port=free_port(), cpus=c, max_model_len=2048,
                          kv_cache_bytes=64 * 2**20, max_num_seqs=64, extra_args=extra)
             for n, c, extra in (("compiled", sets[0], ()), ("eager", sets[1], ("--enforce-eager",)))]
    with InstancePool.launch(specs, work, ready_timeout_s=900) as pool:
        async def go():
            a, b = pool.clients
            walls = {"compiled": [], "eager": [], "eager_capture": []}
            for r in range(args.repeats):  # fresh prompts each time: no prefix cache hits
                prompts = [[int(t) for t in rng.integers(4, 260, args.prompt)] for _ in range(args.requests)]
                walls["compiled"].append((await _batch(a, prompts, args.tokens, f"a{r}"))[0])
                walls["eager"].append((await _batch(b, prompts, args.tokens, f"b{r}"))[0])
            await b.enable_routing()
            before = await _stats(b)
            results = []
            for r in range(args.repeats):
                prompts = [[int(t) for t in rng.integers(4, 260, args.prompt)] for _ in range(args.requests)]
                wall, results = await _batch(b, prompts, args.tokens, f"c{r}")
                walls["eager_capture"].append(wall)
            after = await _stats(b)
            steps = after["steps"] - before.get("steps", 0)
            tokens_total = args.repeats * args.requests * (args.prompt + args.tokens - 1)
            record = {
                "model": "tiny random Qwen3-MoE: hidden 64, 2 layers, 8 experts, top-2, float32 (tests/routing/checkpoint.py)",
                "requests": args.requests, "prompt_tokens": args.prompt, "new_tokens": args.tokens,
                "repeats": args.repeats,
                "batch_wall_s": {k: [round(x, 3) for x in v] for k, v in walls.items()},
                "batch_wall_s_median": {k: round(float(np.median(v)), 3) for k, v in walls.items()},
                "capture_steps": steps,
                "capture_tokens": after["tokens"] - before.get("tokens", 0),
                "capture_us_per_step": round(1e6 * (after["capture_s"] + after["flush_s"]) / max(steps, 1), 1),
                "capture_hook_us_per_step": round(1e6 * after["capture_s"] / max(steps, 1), 1),
                "file_rows_us_per_step": round(1e6 * after["flush_s"] / max(steps, 1), 1),
                "routing_bytes_per_token": results[0].routing.layers * results[0].routing.top_k,
                "fetch_json_bytes": b.routing_fetch_bytes,
                "fetch_json_bytes_per_token": round(b.routing_fetch_bytes / tokens_total, 2),
                "fetch_s_per_request": round(b.routing_fetch_s / (args.repeats * args.requests), 5),
                "stored_after_take": after["stored_requests"],
                "vs_transformers": _disagreement(model, results, prompts),
                # the same tokens through transformers in bfloat16: how often numerics alone change
                # a router decision (what routing replay removes from training)
                "vs_transformers_bf16": _disagreement(model, results, prompts, "bfloat16"),
            }
            for c in pool.clients:
                await c.close()
            return record

        record = asyncio.run(go())
    record["command"] = "python -m bench.routing_capture " + " ".join(sys.argv[1:] if argv is None else argv)
    print(json.dumps(record, indent=2))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "capture.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
