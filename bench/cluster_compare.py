"""One Ray node vs two simulated nodes: the same two instances and workload, in paired repeats.

    flock /tmp/seer-vllm.lock env LD_PRELOAD=.venv/lib/libiomp5.so python -m bench.cluster_compare --repeats 2

Each repeat runs `seer-run --sync` once per placement, in alternating order: on the one-node Ray
that seer-run starts for itself (both instances on one node, a core each), and on a two-node Ray
cluster (bench.harness.ray_nodes: 127.0.0.3 and 127.0.0.4, a core each; STRICT_SPREAD puts an instance
and a KV store on each node, so every chunk that changes instance changes node). Per run: rollout
output tokens/s per instance, every iteration; the weight push (weight_sync_s); Ray's start-up.
The workload moves every continuation chunk to the other instance, the pool's worst case.
Writes bench/results/cluster_compare/ (json, md with the table, png); the node-loss recovery time
comes from tests/fleet/test_two_nodes.py's record (bench/results/failures/run_node_loss.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.proc_cpu import ProcCpu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "cluster_compare"
# Every continuation chunk changes instance (MoveEveryChunk), so on two nodes every one loads its
# prefix across nodes: the pool's worst case, not the scheduler's choice.
WORKLOAD = {"model.preset": "tiny", "task.num_prompts": 16, "rollout.groups_per_iteration": 16,
            "rollout.group_size": 8, "rollout.max_tokens": 256, "scheduler.chunk_size": 64,
            "scheduler.policy": "seer.scheduler.policies.moving:MoveEveryChunk",
            "kvpool.capacity_bytes": 64 * 2**20, "trainer.lr": 1e-4}


def run_job(run_dir: Path, sets: dict, env: dict, iterations: int, log, roots: list[int]) -> dict:
    """One seer-run; `roots` (the cluster's node processes) and seer-run itself are watched for CPU."""
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", str(iterations), "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.monotonic()
    with open(run_dir.with_suffix(".out"), "w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        cpu = ProcCpu([proc.pid, *roots]).start()
        try:
            rc = proc.wait(timeout=1800)
        finally:
            cpu.stop()
        if rc != 0:
            out.seek(0)
            raise RuntimeError(f"seer-run failed ({rc}):\n{out.read()[-6000:]}")
    windows = rollout_windows(run_dir)
    text = (run_dir / "run.log").read_text()
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ray = re.search(r"a one-node Ray on \S+ in ([\d.]+) s", text)
    nodes = sorted(set(re.findall(r"inst\d+ on node (\S+) ", text)))
    result = {
        "wall_s": round(time.monotonic() - t0, 1),
        "nodes": nodes,
        "ray_start_s": float(ray.group(1)) if ray else None,
        "tokens_per_s_per_instance": [r["tokens_per_s"] / len(r["instances"]) for r in recs],
        "rollout_s": [r["wall_s"] for r in recs],
        "weight_sync_s": [r.get("weight_sync_s") for r in recs if r.get("weight_sync_s") is not None],
        "chunks_migrated": [r.get("chunks_migrated") for r in recs],
        "migrated_prefix_tokens_cached": [r.get("migrated_prefix_tokens_cached") for r in recs],
        "reward_mean": [r.get("reward_mean") for r in recs],
        "output_tokens": [round(r["tokens_per_s"] * r["wall_s"]) for r in recs],
        # CPU seconds each kind of process spent inside the rollout phases, by the cores it may use
        "rollout_cpu_s": cpu.window_cpu(windows),
        "rollout_phase_s": sum(b - a for a, b in windows),
        "rollout_cpu_unnamed": cpu.unnamed(windows),
    }
    log(f"  {'+'.join(nodes)}: {result['tokens_per_s_per_instance']} tok/s per instance, "
        f"sync {result['weight_sync_s']} s, wall {result['wall_s']} s")
    return result


def rollout_windows(run_dir: Path) -> list[tuple[float, float]]:
    """Each iteration's rollout phase on the host's monotonic clock, from the run's trace files."""
    out = []
    for path in sorted(run_dir.rglob("*.trace.json")):
        trace = json.loads(path.read_text())
        t0 = trace["otherData"]["t0_monotonic_s"]
        out += [(t0 + ev["ts"] / 1e6, t0 + (ev["ts"] + ev["dur"]) / 1e6) for ev in trace["traceEvents"]
                if ev.get("ph") == "X" and ev.get("cat") == "phase" and ev["name"] == "rollout"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2, help="paired repeats (each: one run per placement)")
    p.add_argument("--iterations", type=int, default=2, help="iterations per seer-run (weights pushed between them)")
    p.add_argument("--out", type=Path, default=OUT, help="results folder")
    args = p.parse_args(argv)
    from bench.harness.ray_nodes import RayNodes

    tmp = Path(tempfile.mkdtemp(prefix="seer-cc-", dir="/tmp"))
    env = dict(os.environ)  # seer-run starts its own Ray, with its own token
    cores = sorted(os.sched_getaffinity(0))[:2]
    cluster = RayNodes(tmp / "two").start(["127.0.0.3", "127.0.0.4"], [str(c) for c in cores])
    two = {**WORKLOAD, "cluster.address": cluster.address, "cluster.node_ip": "127.0.0.3",
           "cluster.placement_strategy": "STRICT_SPREAD"}
    runs: dict[str, list[dict]] = {"one_node": [], "two_nodes": []}
    t0 = time.monotonic()
    try:
        for k in range(args.repeats):
            order = [("one_node", WORKLOAD), ("two_nodes", two)]
            for name, sets in (order if k % 2 == 0 else order[::-1]):
                print(f"repeat {k + 1}/{args.repeats}: {name}", flush=True)
                two_nodes = name == "two_nodes"
                runs[name].append(run_job(tmp / f"{name}-{k}", sets, cluster.env() if two_nodes else env,
                                          args.iterations, lambda m: print(m, flush=True),
                                          [n.proc.pid for n in cluster.nodes] if two_nodes else []))
    finally:
        cluster.stop()
    result = summarize(runs, args, time.monotonic() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cluster_compare.json").write_text(json.dumps(result, indent=2))
    (args.out / "cluster_compare.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def summarize(runs: dict, args, elapsed_s: float) -> dict:
    pairs = list(zip(runs["one_node"], runs["two_nodes"]))
    ratios = [statistics.mean(b["tokens_per_s_per_instance"]) / statistics.mean(a["tokens_per_s_per_instance"])
              for a, b in pairs]
    loss = ROOT / "bench" / "results" / "failures" / "run_node_loss.json"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {
        "command": f"python -m bench.cluster_compare --repeats {args.repeats} --iterations {args.iterations}",
        "date": time.strftime("%Y-%m-%d"), "commit": commit, "elapsed_s": round(elapsed_s, 1),
        "loadavg": os.getloadavg(), "workload": WORKLOAD, "runs": runs,
        "per_instance_throughput_ratio": ratios,
        "per_instance_throughput_ratio_mean": statistics.mean(ratios),
        "node_loss": json.loads(loss.read_text()) if loss.exists() else None,
        "rollout_cpu": {name: cpu_attribution(rs) for name, rs in runs.items()},
    }


def cpu_attribution(runs: list[dict]) -> dict:
    """Where the rollout phases' CPU went, over all runs of one placement: cores in use per kind
    (CPU s / rollout s), per core set, and the engines' CPU (engine core and model worker) per
    output token."""
    phase_s = sum(r["rollout_phase_s"] for r in runs) or float("nan")
    by_kind: dict[str, float] = {}
    by_core: dict[str, dict[str, float]] = {}
    for r in runs:
        for kind, cores in r["rollout_cpu_s"].items():
            for c, sec in cores.items():
                by_kind[kind] = by_kind.get(kind, 0.0) + sec / phase_s
                by_core.setdefault(c, {}).setdefault(kind, 0.0)
                by_core[c][kind] += sec / phase_s
    tokens = sum(sum(r["output_tokens"]) for r in runs)
    engine = sum(sec for r in runs for k in ("vllm engine", "vllm worker")
                 for sec in r["rollout_cpu_s"].get(k, {}).values())
    return {"cores_in_use": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])), "by_core_set": by_core,
            "engine_cpu_us_per_token": 1e6 * engine / tokens if tokens else None, "rollout_phase_s": phase_s}


def markdown(r: dict) -> str:
    def cell(name: str, key: str, fmt: str = "{:.1f}") -> str:
        vals = [v for run in r["runs"][name] for v in (run[key] if isinstance(run[key], list) else [run[key]])
                if v is not None]
        return " / ".join(fmt.format(v) for v in vals) if vals else "-"

    rows = [("per-instance rollout tokens/s (each iteration of each repeat)", "tokens_per_s_per_instance", "{:.0f}"),
            ("rollout s", "rollout_s", "{:.1f}"), ("weight push s", "weight_sync_s", "{:.2f}"),
            ("chunks migrated", "chunks_migrated", "{:.0f}"),
            ("migrated prefix tokens loaded from the pool", "migrated_prefix_tokens_cached", "{:.0f}"),
            ("Ray start-up s (seer-run's own Ray)", "ray_start_s", "{:.1f}"), ("wall s", "wall_s", "{:.0f}")]
    lines = [f"# One Ray node vs two simulated nodes ({r['date']}, commit {r['commit']})", "",
             f"`{r['command']}` (load average at the end {r['loadavg'][0]:.1f})", "",
             "| | one node (2 instances) | two nodes (an instance each) |", "|---|---|---|"]
    lines += [f"| {label} | {cell('one_node', k, f)} | {cell('two_nodes', k, f)} |" for label, k, f in rows]
    lines += ["", "Per-instance throughput, two nodes / one node, per paired repeat: "
              + ", ".join(f"{x:.3f}" for x in r["per_instance_throughput_ratio"])
              + f" (mean {r['per_instance_throughput_ratio_mean']:.3f})."]
    if att := r.get("rollout_cpu"):
        one, two = att["one_node"], att["two_nodes"]
        kinds = list(dict.fromkeys([*one["cores_in_use"], *two["cores_in_use"]]))
        lines += ["", "Where the rollout phases' CPU went (cores in use: CPU s of each kind of process / rollout s, "
                  "all runs of a placement; bench/harness/proc_cpu.py):", "",
                  "| process | one node | two nodes |", "|---|---|---|"]
        lines += [f"| {k} | {one['cores_in_use'].get(k, 0):.3f} | {two['cores_in_use'].get(k, 0):.3f} |" for k in kinds]
        lines += [f"| all | {sum(one['cores_in_use'].values()):.3f} | {sum(two['cores_in_use'].values()):.3f} |",
                  f"| vLLM engine and worker CPU per output token (us) | {one['engine_cpu_us_per_token']:.0f} | "
                  f"{two['engine_cpu_us_per_token']:.0f} |"]
        lines += ["", "Two nodes, by the cores a process may use: " + "; ".join(
            f"cores {c}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v >= 0.005)
            for c, d in sorted(two["by_core_set"].items()))]
    if r.get("node_loss"):
        m = r["node_loss"].get("measured", {})
        lines += ["", f"Node loss (bench/results/failures/run_node_loss.json): instance dropped "
                  f"{m.get('dropped_after_loss_s')} s after the node was lost; its processes gone after "
                  f"{m.get('processes_gone_after_loss_s')} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
