"""Does the simulator rank the configurations as real runs of the same workload do?

    python -m bench.sim_vs_real [--rounds 5] [--out bench/results/sim_vs_real]

(under the vLLM lock on a shared machine: `flock /tmp/seer-vllm.lock env LD_PRELOAD=... python -m ...`)

Real: two vLLM instances of the tiny model (one core each, pinned whole), hidden lengths enforced
by bench.harness.trace_backend, each configuration once per round (order rotating: A B C, B C A, C A B,
...) through bench.compare.run_one (no KV pool: a chunk that moves recomputes its prefix).
Simulated: the same workload, lengths, prompt lengths, batch limit, KV block and policies through
seer.sim, with the step model fitted from seer/sim/step_times.json and the per-chunk cost fitted
from seer/sim/chunk_costs.json (`python -m bench.sim.measure_chunks`, docs/bench.md). A pair counts
when the simulator puts one configuration > 20% above the other; its real order is the median,
over rounds, of the ratio within a round (runs next to each other share the machine's load).

The workload is the imbalance divided rollout exists to remove: four groups of 32 requests, two
long (1000-1119 tokens) that group round-robin puts on the same instance (groups 0 and 2 ->
inst0) and two short ones (30-69 tokens) that leave the other instance idle after a second.
KV is ample (no preemption), and batches are large enough (64 long requests on one instance
against 32 on each) for the per-token cost to matter. 512-token chunks (three per long request).
The simulator puts divided rollout and context-aware scheduling 1.4x above the baseline, and ties
them with it when the long groups are swapped onto different instances, so the order is decided
by balance.

A benchmark, not a test: timed runs on a shared 2-core machine order a pair the same way only most
of the time; tests/bench/test_sim_vs_real.py keeps the deterministic part (the simulator's order).
Its earlier versions: docs/bench-log.md, "the sim-vs-real test's earlier versions".

Writes `<out>/sim_vs_real.json` (settings, simulated and real tokens/s, ratios per round, medians,
whether each pair agrees, load average, the exact command) and `<out>/sim_vs_real.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from seer.sim.ladder import BY_NAME
from seer.sim.chunk_model import load_chunk_costs
from seer.sim.simulate import SimSettings, simulate
from seer.sim.speculation import AcceptanceTable
from seer.sim.step_model import load
from seer.sim.workloads import Workload

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "sim_vs_real"

# The oracle is left out: in the simulator it ties divided and context here (two lengths per
# instance set, nothing to order), and its runs would add a minute per round.
CONFIGS = ("baseline", "divided", "context")
SEPARATED = 1.2  # a pair counts when the simulator puts one > 20% above the other
SEED = 3

G = 32
LONG_GROUPS = (0, 2)  # group round-robin: even groups -> inst0, odd -> inst1
MAX_SEQS = 128
BLOCK = 128  # vLLM's CPU backend allocates KV in 128-token blocks; the scheduler aligns chunks to them


def hidden_lengths(long_groups=LONG_GROUPS) -> dict:
    return {(g, k): (1000 + (37 * k) % 120 if g in long_groups else 30 + (13 * k) % 40) for g in range(4) for k in range(G)}


HIDDEN = hidden_lengths()

WORKLOAD = Workload(
    "sim-vs-real", instances=2, groups=4, group_size=G, max_tokens=1536, mean_tokens=550, prompt_tokens=58,
    kv_capacity_tokens=131072, max_num_seqs=MAX_SEQS, chunk_size=512,
)


def sim_throughput(prompt_tokens: int, hidden: dict = HIDDEN) -> dict[str, float]:
    """Simulated tokens/s of each configuration on the workload with this mean prompt length."""
    w = replace(WORKLOAD, prompt_tokens=prompt_tokens)
    settings = SimSettings(load().model, AcceptanceTable.paper(), chunk_cost=load_chunk_costs(), kv_pool=False,
                           block_size=BLOCK)
    return {c: simulate(w, BY_NAME[c], hidden, settings).stats.tokens_per_s for c in CONFIGS}


def separated_pairs(sim: dict[str, float]) -> list[tuple[str, str]]:
    """(a, b) where the simulator puts a clearly above b."""
    return [(a, b) for a in CONFIGS for b in CONFIGS if sim[a] > SEPARATED * sim[b]]


def _settings(model: Path):
    from bench.compare import CompareSettings

    return CompareSettings(mode="trace", model=str(model), groups=WORKLOAD.groups, group_size=WORKLOAD.group_size,
                           max_tokens=WORKLOAD.max_tokens, mean_tokens=WORKLOAD.mean_tokens,
                           chunk_size=WORKLOAD.chunk_size, max_num_seqs=MAX_SEQS, seed=SEED)


def real_rounds(model: Path, prompts, rounds: int, log_dir: Path, progress=print) -> list[dict[str, float]]:
    """Real tokens/s of each configuration, `rounds` times, order rotating."""
    from bench.compare import run_one
    from bench.harness.instances import instance_specs
    from seer.sim.ladder import BenchConfig
    from bench.harness.trace_backend import TraceBackend
    from seer.fleet.pool import InstancePool
    from seer.procs import cpu_sets

    s = _settings(model)
    prompt_lens = {g: len(p.prompt_ids) for g, p in enumerate(prompts)}
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    # 512 B of KV per token for the tiny model: 64 MiB = 131072 slots, what WORKLOAD.kv_capacity_tokens says.
    specs = instance_specs(replace(s, kv_cache_bytes=64 << 20), model, sets)
    with InstancePool.launch(specs, log_dir, ready_timeout_s=300) as pool:
        async def go():
            try:
                # Untimed warm-up: an instance's first requests and first continuations pay set-up costs.
                warm = {k: min(v, 200) for k, v in HIDDEN.items()}
                await run_one([TraceBackend(c, warm, prompt_lens) for c in pool.clients], pool.clients,
                              BenchConfig("warm", "divided", chunk_size=128), prompts, replace(s, max_tokens=200), "warm-")
                backends = [TraceBackend(c, HIDDEN, prompt_lens) for c in pool.clients]
                out_rounds = []
                for r in range(rounds):
                    out = {}
                    for name in CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]:
                        stats, _, lengths = await run_one(backends, pool.clients, BY_NAME[name], prompts, s,
                                                          f"r{r}-{name}-", HIDDEN)
                        assert lengths == HIDDEN, "a request did not end at its hidden length"
                        out[name] = stats.tokens_per_s
                        progress(f"round {r} {name}: {stats.tokens_per_s:.0f} tok/s "
                                 f"(load average {os.getloadavg()[0]:.1f})")
                    out_rounds.append(out)
                return out_rounds
            finally:
                await pool.aclose_clients()

        return asyncio.run(go())


def summarize(sim: dict[str, float], mean_prompt: int, rounds: list[dict[str, float]], command: str,
              elapsed_s: float, loads: list[float]) -> dict:
    pairs = separated_pairs(sim)
    verdicts = {}
    for a, b in pairs:
        ratios = [r[a] / r[b] for r in rounds]
        verdicts[f"{a}/{b}"] = {"sim_ratio": round(sim[a] / sim[b], 3), "real_ratios": [round(x, 3) for x in ratios],
                                "real_median": round(statistics.median(ratios), 3),
                                "agrees": statistics.median(ratios) > 1.0}
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "bench": "sim_vs_real", "command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit,
        "machine": platform.platform(), "cpus": len(os.sched_getaffinity(0)),
        "load_average_1m": {"min": round(min(loads), 1), "max": round(max(loads), 1)},
        "elapsed_s": round(elapsed_s, 1),
        "workload": {"groups": WORKLOAD.groups, "group_size": G, "long_groups": list(LONG_GROUPS),
                     "chunk_size": WORKLOAD.chunk_size, "max_num_seqs": MAX_SEQS, "mean_prompt_tokens": mean_prompt},
        "sim_tokens_per_s": {c: round(v, 2) for c, v in sim.items()},
        "real_tokens_per_s": [{c: round(v, 2) for c, v in r.items()} for r in rounds],
        "pairs": verdicts,
        "all_agree": all(v["agrees"] for v in verdicts.values()),
    }


def markdown(res: dict) -> str:
    lines = [f"# sim vs real ({res['date']}, commit {res['commit']})", "",
             f"`{res['command']}`: {len(res['real_tokens_per_s'])} rounds, {res['elapsed_s']:.0f} s, load average "
             f"{res['load_average_1m']['min']}-{res['load_average_1m']['max']}", "",
             "| pair | simulated ratio | real ratios per round | real median | agrees |", "|---|---|---|---|---|"]
    for pair, v in res["pairs"].items():
        lines.append(f"| {pair} | {v['sim_ratio']:.2f} | {' / '.join(f'{x:.2f}' for x in v['real_ratios'])} | "
                     f"{v['real_median']:.2f} | {'yes' if v['agrees'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the three configurations (default 5)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the comparison's JSON and markdown go")
    args = ap.parse_args(argv)
    from bench.compare import _prompts
    from seer.model import ensure_model

    command = "python -m bench.sim_vs_real" + (f" --rounds {args.rounds}" if args.rounds != 5 else "") + (
        f" --out {args.out}" if args.out != DEFAULT_OUT else "")
    t0 = time.monotonic()
    loads = [os.getloadavg()[0]]
    model = ensure_model("tiny", progress=False)
    prompts = _prompts(_settings(model), model)
    mean_prompt = round(sum(len(p.prompt_ids) for p in prompts) / len(prompts))
    sim = sim_throughput(mean_prompt)
    print(f"simulated tok/s {({c: round(v) for c, v in sim.items()})} (mean prompt {mean_prompt} tokens)", flush=True)

    def progress(msg):
        loads.append(os.getloadavg()[0])
        print(msg, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    rounds = real_rounds(model, prompts, args.rounds, args.out / "logs", progress)
    res = summarize(sim, mean_prompt, rounds, command, time.monotonic() - t0, loads)
    (args.out / "sim_vs_real.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / "sim_vs_real.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
