"""Simulate a recorded `bench.compare` run's workload: its lengths, its instances, its chunking.

    python -m bench.sim.replay_compare [bench/results/compare/compare.json [BREAKDOWN.json]]

A check of the simulator against the real ladder: the lengths the real run replayed in every
configuration go through the same policies on modelled instances (the step model fitted here,
the measured chunk cost, the run's KV per instance, block size and batch limit), and the
throughput ratios to the baseline (or, in a run without it, to its first configuration) are
printed next to the real ones. Absolute times differ (the step model is fitted on the tiny model);
the ratios are what is compared.

Grouped SD is simulated when the run is paired with a recorded ``bench.spec_breakdown`` of the
same code (``BREAKDOWN``, or ``SPEC_BREAKDOWN`` for the runs listed there): what verifying drafts
costs relative to a step's fixed cost comes from it (``seer.sim.speculation.SpecCost.measured``),
the acceptance from the offline measurement of this model (``bench/results/dgds_acceptance``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from seer.sim.ladder import select
from seer.sim.chunk_model import load_chunk_costs
from seer.sim.simulate import SimSettings, simulate
from seer.sim.speculation import AcceptanceTable, SpecCost
from seer.sim.step_model import load
from seer.sim.workloads import Workload
from seer.kvpool.accounting import kv_bytes_per_token as pool_kv_bytes_per_token
from seer.model.presets import get_preset

ACCEPTANCE = "bench/results/dgds_acceptance/dgds_acceptance.json"
# A recorded compare run -> the breakdown measured on its code (what grouped SD's steps cost).
SPEC_BREAKDOWN = {
    "bench/results/compare/compare.json": "bench/results/spec_breakdown/spec_breakdown.json",
    "bench/results/compare/sd_context/compare.json": "bench/results/spec_breakdown/spec_breakdown_lean.json",
    "bench/results/compare/sd_context_margin/compare.json": "bench/results/spec_breakdown/spec_breakdown_margin.json",
    "bench/results/compare/sd_context_margin5/compare.json": "bench/results/spec_breakdown/spec_breakdown_margin.json",
}


def kv_bytes_per_token(model: str) -> int:
    """fp32 KV bytes per token of the run's model: a checkpoint directory, or an embedded preset
    (read from its recipe, so the check needs no built model)."""
    if Path(model).is_dir():
        return pool_kv_bytes_per_token(model, "float32")
    a = get_preset(model).arch
    return a.num_layers * a.num_kv_heads * (a.hidden_size // a.num_heads) * 2 * 4


def ratios(path: str, breakdown: str | None = None) -> tuple[dict[str, float], dict[str, float], str]:
    """Real and simulated tokens/s relative to the baseline (else the run's first configuration),
    per configuration (grouped SD only with a breakdown: ``breakdown``, else the run's entry in
    ``SPEC_BREAKDOWN``), and a line describing the workload."""
    j = json.load(open(path))
    s = j["settings"]
    runs = j["runs"]
    breakdown = breakdown or SPEC_BREAKDOWN.get(path)
    hidden = {tuple(int(x) for x in k.split("-")): v for k, v in runs[0]["lengths"].items()}
    # the baseline sends each request once: its prompt tokens are the prompts' own (a run without
    # it: a chunked configuration's computed prefill, every prompt once, the rest from the cache)
    names_run = list(dict.fromkeys(r["config"] for r in runs))
    ref = "baseline" if "baseline" in names_run else names_run[0]
    total = next(r for r in runs if r["config"] == ref)["stats"]["extra"]["breakdown"]["total"]
    prompt = round(total["prompt_tokens" if ref == "baseline" else "prefill_tokens_computed"] / len(hidden))
    w = Workload("replay", instances=s["instances"], groups=s["groups"], group_size=s["group_size"],
                 max_tokens=s["max_tokens"], mean_tokens=round(statistics.mean(hidden.values())), prompt_tokens=prompt,
                 kv_capacity_tokens=s["kv_cache_bytes"] // kv_bytes_per_token(s["model"]), max_num_seqs=s["max_num_seqs"],
                 chunk_size=s["chunk_size"])
    spec = SpecCost.measured(breakdown) if breakdown else SpecCost()
    settings = SimSettings(load().model, AcceptanceTable.measured(ACCEPTANCE), chunk_cost=load_chunk_costs(),
                           kv_pool=s["kv_pool"], block_size=128, spec_cost=spec)
    configs = {c.name: c for c in select(",".join(names_run)) if breakdown or not c.speculate}
    # A recording made before runs stored their scheduler settings ran divided rollout with the
    # re-queue at the end of the queue (DividedFifo's default): simulate what ran.
    recorded = j.get("config_sched", {"divided": {}})
    configs = {n: replace(c, sched=tuple(recorded[n].items())) if n in recorded else c for n, c in configs.items()}
    names = list(configs)
    real = {n: statistics.mean(r["stats"]["tokens_per_s"] for r in runs if r["config"] == n) for n in names}
    sim = {n: simulate(w, configs[n], hidden, settings).stats.tokens_per_s for n in names}
    about = (f"{len(hidden)} requests, {sum(hidden.values())} tokens, prompt {prompt}, KV {w.kv_capacity_tokens} slots; "
             f"ratios to {ref}; SD costs: {spec.source}")
    return ({n: v / real[ref] for n, v in real.items()}, {n: v / sim[ref] for n, v in sim.items()}, about)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim.replay_compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", default="bench/results/compare/compare.json",
                    help="a recorded compare.json whose lengths, instances and chunking are replayed")
    ap.add_argument("breakdown", nargs="?", default=None,
                    help="a recorded spec_breakdown JSON of the same code (grouped SD's costs); default: "
                         "SPEC_BREAKDOWN's entry for the run, else grouped SD is left out")
    args = ap.parse_args(argv)
    real, sim, about = ratios(args.path, args.breakdown)
    print(f"{args.path}: {about}")
    print("| configuration | real vs reference | simulated vs reference |")
    print("|---|---|---|")
    for n in real:
        print(f"| {n} | {real[n]:.2f} | {sim[n]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
