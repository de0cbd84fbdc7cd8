"""Paper-scale ablation by simulation: `python -m bench.sim [--scenarios ...] [--scale 1.0]`.

For each of the paper's workloads (Table 3) it simulates one iteration under every configuration
of the ladder, with the same hidden lengths, and prints throughput relative to the baseline next
to the paper's Table 4. The paper's instances are H800s, so their steps are priced by the roofline
of the model's and the GPU's published sizes (`seer/sim/hardware.py`); `--step-model measured`
uses the fit to vLLM step times measured on this machine (`seer/sim/step_times.json`) instead,
whose proportions are a CPU's. The fit and its error are printed either way. Acceptance comes
from the paper's Table 2.
Writes bench/results/sim/sim_ablation.{json,md} (sim_ablation_measured.* with the measured fit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from seer.sim.ladder import parse_sched, select
from seer.sim.chunk_model import GPU_CLUSTER
from seer.sim.hardware import describe as describe_roofline
from seer.sim.simulate import SimRun, SimSettings, simulate
from seer.sim.speculation import AcceptanceTable
from seer.sim.step_model import STEP_TIMES, load
from seer.sim.workloads import PAPER_TABLE4, PAPER_WORKLOADS

# Fractions of the paper's instances and requests simulated by default, so that each scenario
# (all configurations, two seeds) takes under a minute here; per-instance load is unchanged.
DEFAULT_SCALE = {"moonlight": 1.0, "qwen2vl72b": 0.5, "kimik2": 0.375}
TOLERANCE = 0.25  # the bar: full Seer vs baseline within +-25% of the paper's figure


def run_scenario(name: str, scale: float, seeds: list[int], settings: SimSettings, configs,
                 overrides: dict | None = None, trace_dir: Path | None = None) -> dict:
    w = PAPER_WORKLOADS[name]
    if overrides:
        w = replace(w, **overrides)
    if scale != 1.0:
        w = w.scaled(scale)
    per_seed: list[dict[str, SimRun]] = []
    for seed in seeds:
        hidden = w.hidden_lengths(seed)
        per_seed.append({c.name: simulate(w, c, hidden, settings, seed,
                                          trace_to=trace_dir / f"{name}_{c.name}.trace.json"
                                          if trace_dir is not None and seed == seeds[0] else None)
                         for c in configs})
    rows = {}
    for c in configs:
        runs = [s[c.name] for s in per_seed]
        ratios = [s[c.name].stats.tokens_per_s / s["baseline"].stats.tokens_per_s for s in per_seed] \
            if "baseline" in per_seed[0] else [float("nan")]
        st = [r.stats for r in runs]
        rows[c.name] = {
            "label": c.label,
            "tokens_per_s": statistics.mean(s.tokens_per_s for s in st),
            "ratio": statistics.mean(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "wall_s": statistics.mean(s.wall_s for s in st),
            "tail_s": statistics.mean(s.tail_s for s in st),
            "idle_fraction": statistics.mean(statistics.mean(i.idle_fraction for i in s.instances) for s in st),
            "preemptions": statistics.mean(s.preemptions for s in st),
            "chunks_migrated": statistics.mean(s.extra.get("chunks_migrated", 0) for s in st),
            "pool_loads": statistics.mean(s.extra.get("pool_loads", 0) for s in st),
            "longest_queued_s": statistics.mean(s.extra["longest_queued_s"] for s in st),
            "mean_running": statistics.mean(s.extra["mean_running"] for s in st),
            "mean_kv_used": statistics.mean(s.extra["mean_kv_used"] for s in st),
            "mean_acceptance_length": runs[0].mean_acceptance_length,
            "paper": PAPER_TABLE4[name].get(c.name),
            "sim_seconds": sum(r.sim_seconds for r in runs),
            "sim_cpu_seconds": sum(r.sim_cpu_seconds for r in runs),
        }
    return {"workload": {k: v for k, v in asdict(w).items()}, "seeds": seeds, "configs": rows}


def parse_overrides(items: list[str]) -> dict:
    """`--set FIELD=VALUE` items as Workload field overrides (ints, floats)."""
    known = {f.name: f.type for f in fields(PAPER_WORKLOADS["moonlight"])}
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in known or not value:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {sorted(known)}")
        out[key] = float(value) if "." in value or "e" in value.lower() else int(value)
    return out


def parse_scheduler(items: list[str]) -> tuple[tuple[str, object], ...]:
    """`--sched FIELD=VALUE` items as SchedulerConfig field overrides (booleans, ints, floats)."""
    # set by simulate() from the configuration, the workload and its token unit
    derived = frozenset({"policy", "chunk_size", "block_size", "affinity_gap_tokens", "kv_capacity_tokens",
                         "max_running", "kv_pool"})
    try:
        return parse_sched(items, derived)
    except ValueError as e:
        raise SystemExit(f"--sched {e}") from None


def check(result: dict) -> list[str]:
    """The issue's acceptance bar, as findings (empty = met)."""
    out = []
    rows = result["configs"]
    ladder = [n for n in ("baseline", "divided", "context", "grouped_sd") if n in rows]
    for a, b in zip(ladder, ladder[1:]):
        if rows[b]["ratio"] < rows[a]["ratio"]:
            out.append(f"{b} ({rows[b]['ratio']:.3f}) below {a} ({rows[a]['ratio']:.3f})")
    if "grouped_sd" in rows and rows["grouped_sd"]["paper"]:
        got, paper = rows["grouped_sd"]["ratio"], rows["grouped_sd"]["paper"]
        if abs(got - paper) / paper > TOLERANCE:
            out.append(f"full Seer {got:.2f}x vs paper {paper:.2f}x: off by {abs(got - paper) / paper:.0%} (> 25%)")
    return out


def markdown(results: dict[str, dict], fit_text: str, command: str, roofline: bool = False) -> str:
    head = (f"Step-time model: roofline from the model's and the GPU's published sizes (seer/sim/hardware.py), "
            f"per scenario below. The measured fit, not used here: {fit_text}") if roofline else \
        f"Step-time model: {fit_text}"
    lines = [f"`{command}`", "", head, "",
             f"Per-chunk cost (seer/sim/chunk_model.py, GPU clusters): {GPU_CLUSTER.describe()}.", ""]
    for name, res in results.items():
        w = res["workload"]
        pools = (f", {w['dp_ranks']} DP-attention ranks of {w['kv_capacity_tokens'] // w['dp_ranks']:,} each"
                 if w.get("dp_ranks", 1) > 1 else "")
        lines += [
            f"### {name}: {w['instances']} instances, {w['groups']} groups x G={w['group_size']}, "
            f"max {w['max_tokens']} / mean {w['mean_tokens']} tokens (scale {w['paper_scale']:g} of the paper), "
            f"seeds {res['seeds']}",
            "",
            f"KV per instance {w['kv_capacity_tokens']:,} tokens{pools}; max_num_seqs {w['max_num_seqs']} per engine "
            f"(bench/results/sim/sim_calibration.md says where the memory comes from).",
            "",
            *([f"Step model: {res['step_model']}", ""] if roofline else []),
            "| configuration | sim throughput vs baseline (min-max) | paper Table 4 | tail s | longest 5% queued s | idle | running per instance | KV held | preemptions | migrated chunks | prefix loads from the pool | acceptance length |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c, r in res["configs"].items():
            paper = "-" if r["paper"] is None else f"{r['paper']:.2f}"
            mal = "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
            # the baseline hands every request to its instance at once: it never waits in the scheduler
            queued = "-" if c == "baseline" else f"{r['longest_queued_s']:.0f}"
            lines.append(
                f"| {r['label']} | {r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {paper} | "
                f"{r['tail_s']:.0f} | {queued} | {r['idle_fraction']:.0%} | {r['mean_running']:.1f} | "
                f"{r['mean_kv_used']:.0%} | {r['preemptions']:.0f} | {r['chunks_migrated']:.0f} | "
                f"{r['pool_loads']:.0f} | {mal} |"
            )
        findings = res.get("findings") or []
        lines += ["", "Bar (each step >= previous; full Seer within +-25% of the paper): "
                  + ("met" if not findings else "NOT met: " + "; ".join(findings)),
                  f"Simulated in {sum(r['sim_seconds'] for r in res['configs'].values()):.1f} s "
                  f"({sum(r['sim_cpu_seconds'] for r in res['configs'].values()):.1f} s of CPU).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(PAPER_WORKLOADS), help="comma-separated paper workloads to simulate (default: all of %(default)s)")
    ap.add_argument("--configs", default="all", help="comma-separated configurations of the ladder (seer.sim.ladder), or all")
    ap.add_argument("--scale", type=float, default=None,
                    help="fraction of the paper's instances and requests (default: per scenario, DEFAULT_SCALE)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds; each draws the workload's lengths anew")
    ap.add_argument("--step-times", default=str(STEP_TIMES), help="measured step times the 'measured' step model is fitted to")
    ap.add_argument("--step-model", choices=("measured", "roofline"), default="roofline",
                    help="roofline (default): from the paper's model and GPU sizes (seer/sim/hardware.py); "
                         "measured: fitted to --step-times (this machine's vLLM on a CPU core)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a workload field for a sensitivity run (e.g. dp_ranks=1, "
                         "kv_capacity_tokens=1445753); needs --tag")
    ap.add_argument("--sched", action="append", default=[], metavar="FIELD=VALUE",
                    help="set a SchedulerConfig field for every configuration (e.g. early_packing=true); "
                         "needs --tag")
    ap.add_argument("--tag", default=None, help="write sim_ablation[_roofline]_TAG.* instead")
    ap.add_argument("--out", default="bench/results/sim", help="directory for the results' JSON and markdown")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="also write each scenario's and configuration's timeline (first seed) as "
                         "DIR/<scenario>_<config>.trace.json, the format seer-run writes per iteration")
    args = ap.parse_args(argv)
    overrides = parse_overrides(args.set)
    scheduler = parse_scheduler(args.sched)
    if (overrides or scheduler) and not args.tag:
        ap.error("--set and --sched change the runs: give the run a --tag so it does not overwrite the recorded results")

    fit = load(args.step_times)
    settings = SimSettings(step=fit.model, acceptance=AcceptanceTable.paper(), roofline=args.step_model == "roofline",
                           chunk_cost=GPU_CLUSTER, scheduler=scheduler)
    configs = select(args.configs)
    seeds = [int(s) for s in args.seeds.split(",")]
    command = " ".join(["python -m bench.sim", *(sys.argv[1:] if argv is None else argv)])
    roofline = args.step_model == "roofline"
    print(fit.describe(), flush=True)
    print(f"per-chunk cost: {settings.chunk_cost.describe()}", flush=True)
    results = {}
    for name in args.scenarios.split(","):
        t0 = time.perf_counter()
        scale = args.scale if args.scale is not None else DEFAULT_SCALE.get(name, 1.0)
        res = run_scenario(name, scale, seeds, settings, configs, overrides,
                           Path(args.trace) if args.trace else None)
        if roofline:
            w = PAPER_WORKLOADS[name]
            res["step_model"] = describe_roofline(name, w.gpus_per_instance, dp_ranks=w.dp_ranks)
        res["findings"] = check(res)
        res["elapsed_s"] = time.perf_counter() - t0
        results[name] = res
        print(markdown({name: res}, fit.describe(), command, roofline).split("\n", 4)[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"command": command, "overrides": overrides, "scheduler": dict(scheduler), "step_model": asdict(fit.model), "fit": {
        "mean_abs_rel_error": fit.mean_abs_rel_error, "max_abs_rel_error": fit.max_abs_rel_error,
        "points": fit.points, "batch_range": fit.batch_range, "context_range": fit.context_range},
        "step_model_used": args.step_model, "acceptance": settings.acceptance.source, "scenarios": results}
    stem = ("sim_ablation" if roofline else "sim_ablation_measured") + (f"_{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(results, fit.describe(), command, roofline) + "\n")
    return 0
