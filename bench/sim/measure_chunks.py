"""Measure what one more chunk costs on real vLLM instances, for the simulator.

    python -m bench.sim.measure_chunks [--model tiny] [--out seer/sim/chunk_costs.json]

Divided rollout sends a request to an instance once per chunk; `seer.sim.chunk_model` says what
that costs and how it is fitted. This measures it on the production path
(`bench.compare.run_one`: RolloutDriver, divided policy, `bench.harness.trace_backend`, two instances of
one core each): every request exactly `--tokens` long, run as one chunk per request and again cut
into about 2, 4 and 8 chunks, at several numbers of requests per instance, order alternating over
repeats. The breakdown of every run (`bench.harness.breakdown`: HTTP/API overhead per chunk, prefill computed vs
cached) is kept next to them. Takes about 4 minutes with the tiny model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

from seer.sim.chunk_model import CHUNK_COSTS, ChunkCost, fit

DEFAULT_OUT = CHUNK_COSTS
KV_TOKENS = 131072  # 64 MiB per instance at the tiny model's 512 B of KV per token
MAX_SEQS = 128


def step_model_wall_s(run: dict, tokens: int) -> float:
    """The wall time the step model (seer/sim/step_times.json) gives the run's workload as one
    chunk per request with no chunk cost: the simulator on two modelled instances."""
    from seer.sim.ladder import BenchConfig
    from seer.sim.chunk_model import ChunkCost
    from seer.sim.simulate import SimSettings, simulate
    from seer.sim.speculation import AcceptanceTable
    from seer.sim.step_model import load
    from seer.sim.workloads import Workload

    groups = run["requests"] // run["group_size"]
    w = Workload("measure", instances=2, groups=groups, group_size=run["group_size"], max_tokens=tokens,
                 mean_tokens=tokens, prompt_tokens=max(1, round(run["prompt_tokens_mean"])),
                 kv_capacity_tokens=KV_TOKENS, max_num_seqs=MAX_SEQS, chunk_size=2 * tokens)
    hidden = {(g, k): tokens for g in range(groups) for k in range(run["group_size"])}
    settings = SimSettings(load().model, AcceptanceTable.paper(), chunk_cost=ChunkCost(), kv_pool=False)
    return simulate(w, BenchConfig("single", "divided"), hidden, settings).stats.wall_s


def refit(path: Path) -> dict:
    """Recompute the step-model walls and the fit of a saved measurement (after a step-model change)."""
    data = json.loads(path.read_text())
    for r in data["runs"]:
        r["step_model_wall_s"] = step_model_wall_s(r, data["tokens"])
    data["fit"] = fit(data["runs"])
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="an embedded preset or a local HF checkpoint directory")
    ap.add_argument("--batches", default="4,16,48", help="requests per instance")
    ap.add_argument("--tokens", type=int, default=1024, help="every request's length")
    ap.add_argument("--chunks", default="2048,512,256,128", help="chunk sizes (the first: one chunk)")
    ap.add_argument("--repeats", type=int, default=2, help="measurements of each point")
    ap.add_argument("--group-size", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the chunk-costs JSON to write")
    ap.add_argument("--refit", action="store_true", help="only redo the fit of the saved --out")
    args = ap.parse_args(argv)
    if args.refit:
        f = refit(Path(args.out))["fit"]
        print(ChunkCost(f["latency_s"], f["instance_s"]).describe())
        return 0

    from bench.compare import CompareSettings, _prompts, run_one
    from bench.harness.instances import instance_specs
    from seer.sim.ladder import BenchConfig
    from bench.harness.trace_backend import TraceBackend
    from seer.model import ensure_model
    from seer.procs import cpu_sets
    from seer.fleet.pool import InstancePool

    model = Path(args.model) if Path(args.model).is_dir() else ensure_model(args.model, progress=False)
    batches = [int(x) for x in args.batches.split(",")]
    chunk_sizes = [int(x) for x in args.chunks.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    max_seqs = MAX_SEQS
    specs = instance_specs(CompareSettings(model=str(model), max_model_len=2048, kv_cache_bytes=64 << 20,
                                           max_num_seqs=max_seqs, seed=3), model, sets)
    runs: list[dict] = []
    t0 = time.monotonic()
    with InstancePool.launch(specs, Path("/tmp") / "seer-bench-logs", ready_timeout_s=600) as pool:
        async def go():
            try:
                for rep in range(args.repeats):
                    for b in batches:
                        groups = max(1, 2 * b // args.group_size)
                        s = CompareSettings(mode="trace", model=str(model), groups=groups, group_size=args.group_size,
                                            max_tokens=args.tokens, mean_tokens=args.tokens, max_num_seqs=max_seqs,
                                            seed=3)
                        prompts = _prompts(s, model)
                        hidden = {(g, k): args.tokens for g in range(groups) for k in range(args.group_size)}
                        lens = {g: len(p.prompt_ids) for g, p in enumerate(prompts)}
                        backends = [TraceBackend(c, hidden, lens) for c in pool.clients]
                        if rep == 0 and b == batches[0]:
                            await run_one(backends, pool.clients, BenchConfig("warm", "divided", chunk_size=256),
                                          prompts, s, "warm-")
                        order = chunk_sizes if rep % 2 == 0 else chunk_sizes[::-1]
                        for size in order:
                            cfg = BenchConfig(f"divided@{size}", "divided", chunk_size=size)
                            stats, _, got = await run_one(backends, pool.clients, cfg, prompts, s,
                                                          f"r{rep}b{b}c{size}-")
                            assert got == hidden
                            chunks = stats.extra.get("chunks_dispatched", 0)
                            bd = stats.extra["breakdown"]["total"]
                            per_inst = [i["chunks"] for i in stats.extra["breakdown"]["instances"].values()]
                            row = {"repeat": rep, "batch": b, "chunk_size": size, "requests": len(hidden),
                                   "group_size": args.group_size,
                                   "prompt_tokens_mean": sum(lens[g] for g, _ in hidden) / len(hidden),
                                   "chunks": chunks, "chunks_per_request": chunks / len(hidden),
                                   "chunks_per_instance": per_inst,
                                   "wall_s": stats.wall_s, "load_average": os.getloadavg()[0],
                                   "http_overhead_ms_per_chunk": bd["http_overhead_ms_per_chunk"],
                                   "prefill_tokens_computed": bd["prefill_tokens_computed"],
                                   "prompt_tokens": bd["prompt_tokens"], "migrated": bd["moved_chunks"],
                                   "gap_mean_ms": bd["gap_mean_ms"], "preemptions": bd["preemptions"]}
                            runs.append(row)
                            print(f"B={b:3d} chunk {size:5d}: {row['chunks_per_request']:.2f} chunks/request, "
                                  f"wall {stats.wall_s:6.2f} s, HTTP+API {row['http_overhead_ms_per_chunk']:.0f} ms/chunk, "
                                  f"prefill {row['prefill_tokens_computed']}/{row['prompt_tokens']}, migrated "
                                  f"{row['migrated']}, load {row['load_average']:.1f}", flush=True)
            finally:
                await pool.aclose_clients()

        asyncio.run(go())
    for r in runs:
        r["step_model_wall_s"] = step_model_wall_s(r, args.tokens)
    result = fit(runs)
    data = {"fit": result, "runs": runs, "tokens": args.tokens, "model": args.model, "elapsed_s": time.monotonic() - t0,
            "machine": platform.platform(), "cpus": os.cpu_count(),
            "command": "python -m bench.sim.measure_chunks " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"{ChunkCost(result['latency_s'], result['instance_s']).describe()}; per batch: "
          + ", ".join(f"B={s['batch']}: {s['slope_s_per_chunk'] * 1e3:.0f} ms/chunk" for s in result["per_batch"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
