"""Measure a real vLLM instance's decode step time vs batch size and context, for the simulator.

    python -m bench.sim.measure_steps [--model tiny] [--cpus 0] [--out seer/sim/step_times.json]

The simulator's instances need a step-time model; rather than invent one, this measures it:
for each batch size B and prompt length P, B requests run together with `ignore_eos`, once with
N1 and once with N2 new tokens. The difference of the two wall times divided by N2 - N1 is the
time of one decode step at batch B (prefill, HTTP and start-up costs cancel out), at a mean
context of P + (N1 + N2) / 2 tokens per request. A prefill series (one request, max_tokens=1,
growing prompts) gives the per-prompt-token cost used for recompute after preemption.
Takes about two minutes on one core with the tiny model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import time
from pathlib import Path

from seer.sim.step_model import STEP_TIMES
from seer.types import GenerateRequest, SamplingParams

DEFAULT_OUT = STEP_TIMES  # the simulator reads it from there (seer/sim/step_times.json)


def _prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    # Random ids above the special tokens: every request differs, so nothing is shared in the cache.
    return [rng.randrange(3, vocab) for _ in range(length)]


async def _timed_batch(client, batch: int, prompt_len: int, new_tokens: int, rng: random.Random, vocab: int) -> float:
    reqs = [
        GenerateRequest(f"m{rng.getrandbits(40):x}", _prompt(rng, prompt_len, vocab), new_tokens,
                        SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True), logprobs=False)
        for i in range(batch)
    ]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(client.generate(r) for r in reqs))
    wall = time.perf_counter() - t0
    if any(len(r.token_ids) != new_tokens for r in results):
        raise RuntimeError("ignore_eos did not produce exactly max_tokens")
    return wall


async def measure(client, batches, prompt_lens, n1: int, n2: int, repeats: int, prefill_lens, vocab: int) -> dict:
    rng = random.Random(0)
    await _timed_batch(client, 4, 16, 8, rng, vocab)  # warm-up: first requests compile/allocate
    decode = []
    for p in prompt_lens:
        for b in batches:
            steps = []
            for _ in range(repeats):
                w1 = await _timed_batch(client, b, p, n1, rng, vocab)
                w2 = await _timed_batch(client, b, p, n2, rng, vocab)
                steps.append((w2 - w1) / (n2 - n1))
            step = statistics.median(steps)
            decode.append({"batch": b, "prompt_len": p, "mean_context": p + (n1 + n2) / 2,
                           "step_s": step, "samples_s": steps})
            print(f"decode B={b:3d} P={p:4d}: {step * 1e3:7.2f} ms/step", flush=True)
    prefill = []
    for p in prefill_lens:
        walls = [await _timed_batch(client, 1, p, 1, rng, vocab) for _ in range(repeats)]
        prefill.append({"prompt_len": p, "wall_s": statistics.median(walls)})
        print(f"prefill P={p:4d}: {statistics.median(walls) * 1e3:7.2f} ms", flush=True)
    return {"decode": decode, "prefill": prefill}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="an embedded preset or a local HF checkpoint directory")
    ap.add_argument("--cpus", default="0", help="the CPU cores the one vLLM instance is pinned to")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64", help="comma-separated batch sizes B")
    ap.add_argument("--prompt-lens", default="16,512", help="comma-separated prompt lengths P of the decode series")
    ap.add_argument("--prefill-lens", default="64,512,1024,2048", help="comma-separated prompt lengths of the prefill series")
    ap.add_argument("--n1", type=int, default=32, help="new tokens of the shorter run (N1)")
    ap.add_argument("--n2", type=int, default=160, help="new tokens of the longer run (N2); a step is (wall(N2) - wall(N1)) / (N2 - N1)")
    ap.add_argument("--repeats", type=int, default=2, help="measurements of each point")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the step-times JSON to write")
    args = ap.parse_args(argv)

    from seer.model import ensure_model
    from seer.fleet.instance import InstanceSpec
    from seer.procs import free_port
    from seer.fleet.pool import InstancePool

    # A path uses that checkpoint as is; a preset name builds it if needed.
    model = Path(args.model) if Path(args.model).is_dir() else ensure_model(args.model, progress=False)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    spec = InstanceSpec("measure", str(model), free_port(), cpus=args.cpus, max_model_len=4096,
                        kv_cache_bytes=256 << 20, max_num_seqs=128, weight_sync=False,
                        extra_args=("--max-num-batched-tokens", "131072"))
    out = Path(args.out)
    with InstancePool.launch([spec], Path("/tmp") / "seer-bench-logs") as pool:
        client = pool.clients[0]

        async def go():
            try:
                return await measure(client, [int(x) for x in args.batches.split(",")],
                                     [int(x) for x in args.prompt_lens.split(",")], args.n1, args.n2,
                                     args.repeats, [int(x) for x in args.prefill_lens.split(",")], vocab)
            finally:
                await client.close()

        data = asyncio.run(go())
    data.update({"model": args.model, "cpus": args.cpus, "n1": args.n1, "n2": args.n2,
                 "machine": platform.platform(), "command": "python -m bench.sim.measure_steps " + " ".join(argv or [])})
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
