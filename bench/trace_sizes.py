"""How large the per-iteration timelines (rollouts/iter_N.trace.json) are: a real run's, and the
simulator's at the paper's Kimi-K2 scale, written by the same code (seer.watch.trace).

    python -m bench.trace_sizes --run runs/latest            # + the Kimi-K2 simulation
    python -m bench.trace_sizes --run runs/latest --scale 1  # the paper's full instance count

Writes trace_sizes.json / .md, the run's first trace and its plot (timeline.png) into --out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seer.watch.trace import check_trace, chunk_slices, plot_trace


def measure(path: Path) -> dict:
    raw = path.read_bytes()
    trace = json.loads(raw)
    errors = check_trace(trace)
    return {"file": path.name, "bytes": len(raw), "gzip_bytes": len(gzip.compress(raw)),
            "events": len(trace["traceEvents"]), "chunk_slices": len(chunk_slices(trace)),
            "bytes_per_chunk": round(len(raw) / max(1, len(chunk_slices(trace))), 1), "checker_errors": len(errors),
            "metadata": trace.get("otherData", {})}


def simulated(scenario: str, config: str, scale: float, out: Path) -> dict:
    from seer.sim.ladder import select
    from seer.sim.chunk_model import GPU_CLUSTER
    from seer.sim.simulate import SimSettings, simulate
    from seer.sim.speculation import AcceptanceTable
    from seer.sim.step_model import STEP_TIMES, load
    from seer.sim.workloads import PAPER_WORKLOADS

    w = PAPER_WORKLOADS[scenario].scaled(scale) if scale != 1.0 else PAPER_WORKLOADS[scenario]
    settings = SimSettings(step=load(str(STEP_TIMES)).model, acceptance=AcceptanceTable.paper(), roofline=True,
                           chunk_cost=GPU_CLUSTER)
    cfg = next(c for c in select("all") if c.name == config)
    path = out / f"{scenario}_{config}.trace.json"
    simulate(w, cfg, w.hidden_lengths(0), settings, 0, trace_to=path)
    return {**measure(path), "scenario": scenario, "config": config, "scale": scale,
            "instances": w.instances, "requests": w.groups * w.group_size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a seer-run run directory (its rollouts/iter_*.trace.json)")
    ap.add_argument("--scenario", default="kimik2", help="the simulator's paper workload to measure")
    ap.add_argument("--config", default="context", help="the simulated configuration (seer.sim.ladder)")
    ap.add_argument("--scale", type=float, default=0.375,
                    help="fraction of the paper's instances and requests (bench.sim's default for kimik2)")
    ap.add_argument("--out", default="bench/results/trace_sizes", help="where the results go")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Path(args.run)
    traces = sorted((run / "rollouts").glob("iter_*.trace.json"))
    if not traces:
        ap.error(f"{run} has no rollouts/iter_*.trace.json")
    real = [measure(p) for p in traces]
    shutil.copy(traces[0], out / traces[0].name)
    plot_trace(json.loads(traces[0].read_text()), out / "timeline.png",
               title=f"{run.name}, iteration 0: chunks per instance (black: migrated)")
    with tempfile.TemporaryDirectory() as tmp:
        sim = simulated(args.scenario, args.config, args.scale, Path(tmp))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = " ".join(["python -m bench.trace_sizes", *(sys.argv[1:] if argv is None else argv)])
    result = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "command": command, "run": str(run),
              "real": real, "simulated": sim}
    (out / "trace_sizes.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = [f"| {r['file']} (real) | {r['chunk_slices']} | {r['events']} | {r['bytes'] / 1e3:.0f} KB | "
            f"{r['gzip_bytes'] / 1e3:.0f} KB | {r['bytes_per_chunk']:.0f} | {r['checker_errors']} |" for r in real]
    rows.append(f"| {sim['scenario']} {sim['config']}, scale {sim['scale']} ({sim['instances']} instances, "
                f"{sim['requests']} requests; simulated) | {sim['chunk_slices']} | {sim['events']} | "
                f"{sim['bytes'] / 1e6:.1f} MB | {sim['gzip_bytes'] / 1e6:.2f} MB | {sim['bytes_per_chunk']:.0f} | "
                f"{sim['checker_errors']} |")
    md = "\n".join([f"# Trace sizes ({result['date']}, {commit})", "", f"`{command}`", "",
                    "| trace | chunk slices | events | size | gzip | bytes per chunk | checker errors |",
                    "|---|---|---|---|---|---|---|", *rows, ""])
    (out / "trace_sizes.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
