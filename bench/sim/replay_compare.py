"""Simulate a recorded `bench.compare` run's workload: its lengths, its instances, its chunking.

    python -m bench.sim.replay_compare [bench/results/compare/compare.json]

A check of the simulator against the real ladder: the lengths the real run replayed in every
configuration go through the same policies on modelled instances (the step model fitted here,
the measured chunk cost, the run's KV per instance, block size and batch limit), and the
throughput ratios to the baseline are printed next to the real ones. Absolute times differ
(the step model is fitted on the tiny model); the ratios are what is compared.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from bench.configs import select
from bench.sim.chunk_model import load_chunk_costs
from bench.sim.simulate import SimSettings, simulate
from bench.sim.speculation import AcceptanceTable
from bench.sim.step_model import load
from bench.workloads import Workload
from seer.kvpool.accounting import kv_bytes_per_token as pool_kv_bytes_per_token
from seer.model.presets import get_preset

def kv_bytes_per_token(model: str) -> int:
    """fp32 KV bytes per token of the run's model: a checkpoint directory, or an embedded preset
    (read from its recipe, so the check needs no built model)."""
    if Path(model).is_dir():
        return pool_kv_bytes_per_token(model, "float32")
    a = get_preset(model).arch
    return a.num_layers * a.num_kv_heads * (a.hidden_size // a.num_heads) * 2 * 4


def ratios(path: str) -> tuple[dict[str, float], dict[str, float], str]:
    """Real and simulated tokens/s relative to the baseline, per configuration (grouped SD left
    out: the simulator's speculation follows the paper's acceptance, not this machine's), and a
    line describing the workload."""
    j = json.load(open(path))
    s = j["settings"]
    runs = j["runs"]
    hidden = {tuple(int(x) for x in k.split("-")): v for k, v in runs[0]["lengths"].items()}
    # the baseline sends each request once: its prompt tokens are the prompts' own
    base = next(r for r in runs if r["config"] == "baseline")
    prompt = round(base["stats"]["extra"]["breakdown"]["total"]["prompt_tokens"] / len(hidden))
    w = Workload("replay", instances=s["instances"], groups=s["groups"], group_size=s["group_size"],
                 max_tokens=s["max_tokens"], mean_tokens=round(statistics.mean(hidden.values())), prompt_tokens=prompt,
                 kv_capacity_tokens=s["kv_cache_bytes"] // kv_bytes_per_token(s["model"]), max_num_seqs=s["max_num_seqs"],
                 chunk_size=s["chunk_size"])
    settings = SimSettings(load().model, AcceptanceTable.paper(), chunk_cost=load_chunk_costs(), kv_pool=s["kv_pool"],
                           block_size=128)
    configs = {c.name: c for c in select(s["configs"]) if not c.speculate}
    # A recording made before runs stored their scheduler settings ran divided rollout with the
    # re-queue at the end of the queue (DividedFifo's default): simulate what ran.
    recorded = j.get("config_sched", {"divided": {}})
    configs = {n: replace(c, sched=tuple(recorded[n].items())) if n in recorded else c for n, c in configs.items()}
    names = list(configs)
    real = {n: statistics.mean(r["stats"]["tokens_per_s"] for r in runs if r["config"] == n) for n in names}
    sim = {n: simulate(w, configs[n], hidden, settings).stats.tokens_per_s for n in names}
    about = f"{len(hidden)} requests, {sum(hidden.values())} tokens, prompt {prompt}, KV {w.kv_capacity_tokens} slots"
    return ({n: v / real["baseline"] for n, v in real.items()}, {n: v / sim["baseline"] for n, v in sim.items()}, about)


def main(path: str = "bench/results/compare/compare.json") -> int:
    real, sim, about = ratios(path)
    print(f"{path}: {about}")
    print("| configuration | real vs baseline | simulated vs baseline |")
    print("|---|---|---|")
    for n in real:
        print(f"| {n} | {real[n]:.2f} | {sim[n]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
