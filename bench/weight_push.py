"""Weight push: seconds and GB/s per instance, shared directory vs Ray delivery, one node vs two.

    flock /tmp/seer-vllm.lock env LD_PRELOAD=.venv/lib/libiomp5.so python -m bench.weight_push

For each model (the embedded default, and a larger HF Qwen2 with random weights: hidden 1024,
12 layers, 16 heads / 4 KV heads, intermediate 2816, vocab 320, fp32, ~541 MB, built once into the
cache) and each placement (one Ray node with both instances, a core each; two simulated nodes,
127.0.0.3 and .4, an instance and a core each: bench.harness.ray_nodes), one fleet of two instances is
launched and weight versions are pushed with each transport, `--repeats` times:

- shared-fs: the trainer's export writes the checkpoint directory (as the job's export does), and
  every instance reads it (Fleet.weights.push of a local path; no checks).
- ray: the checkpoint's files go into Ray (`ray.put` by the driver, on the first node), each node's
  host fetches them once, checks size and sha256, writes them into its own directory; every worker
  checks them again from disk and loads them (Fleet.weights.push of a payload).

Per push: the export (writing the directory, or hashing and putting the files) and the fleet's
`weights.push` (delivery + load + prefix-cache reset + version check), split into the delivery
per node and the rest. GB/s per instance = checkpoint bytes / push seconds (each instance
gets the whole checkpoint; the two load at once). Writes bench/results/weight_push/
(weight_push.json, weight_push.md with the command).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.harness.provenance import code_version

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "weight_push"
LARGE = {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 4,
         "intermediate_size": 2816}
TRANSPORTS = ("shared-fs", "ray")
PLACEMENTS = {"one_node": ["127.0.0.3"], "two_nodes": ["127.0.0.3", "127.0.0.4"]}


def large_model(progress=print) -> Path:
    """The larger Qwen2 (random weights, the embedded default's tokenizer and vocab), built once."""
    from seer.model import cache_root, resolve_model

    base = resolve_model("default", progress=False)
    out = cache_root() / "models" / ("bench-qwen2-" + "-".join(f"{v}" for v in LARGE.values()))
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoConfig, Qwen2ForCausalLM

    t0 = time.monotonic()
    cfg = AutoConfig.from_pretrained(base)
    for k, v in LARGE.items():
        setattr(cfg, k, v)
    cfg.layer_types = ["full_attention"] * LARGE["num_hidden_layers"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    for f in base.iterdir():
        if f.name.startswith("tokenizer") or f.name == "generation_config.json":
            shutil.copy2(f, tmp / f.name)
    os.replace(tmp, out)
    progress(f"built {out} in {time.monotonic() - t0:.0f} s")
    return out


# ---- one placement, in a job of its own (a process joins one Ray cluster only) -------------------
async def _placement(args) -> dict:
    import ray
    import torch
    from safetensors.torch import load_file

    from seer.dgds.server.config import DGDSConfig
    from seer.fleet import Fleet, LaunchSettings
    from seer.fleet.config import ClusterConfig, InstancesConfig
    from seer.kvpool.config import KVPoolConfig
    from seer.trainer.export import checkpoint_files
    from seer.types import WeightsRef

    two = args.placement == "two_nodes"
    cfg = ClusterConfig(address=args.address, node_ip="127.0.0.3",
                        placement_strategy="STRICT_SPREAD" if two else "STRICT_PACK")
    rows = []
    work = Path(args.work)
    for name, model in zip(args.names, args.models):
        state = load_file(str(Path(model) / "model.safetensors"))
        t0 = time.monotonic()
        fleet = await Fleet.launch(
            InstancesConfig(count=2, kv_cache_bytes=64 * 2**20, max_num_seqs=8), KVPoolConfig(enabled=False),
            DGDSConfig(enabled=False), LaunchSettings(model, max_model_len=1024), work / name, print, cfg)
        print(f"{args.placement} {name}: 2 instances in {time.monotonic() - t0:.0f} s "
              f"on {sorted({s.node.ip for s in fleet.pool.servers})}", flush=True)
        version = 0
        async with fleet:
            for transport in TRANSPORTS:
                fleet.cluster_cfg = replace(cfg, weight_transport=transport)
                for rep in range(args.repeats):
                    version += 1
                    # a new version: one tensor changed (the files differ; the work is the same)
                    key = next(k for k in state if k.endswith("norm.weight"))
                    state[key] = state[key] + 1e-3
                    files = checkpoint_files(state, model, torch.float32)
                    size = sum(len(b) for b in files.values())
                    t0 = time.monotonic()
                    if transport == "shared-fs":  # what the job's export writes, then instances read it
                        out = work / "export" / f"v{version}"
                        out.mkdir(parents=True, exist_ok=True)
                        for fn, data in files.items():
                            (out / fn).write_bytes(data)
                        ref = WeightsRef(version, str(out))
                    else:
                        manifest = WeightsRef.manifest_of(files)
                        obj = ray.put(files)
                        ref = WeightsRef(version, f"ray://{obj.hex()}", payload=obj, manifest=manifest)
                    export_s = time.monotonic() - t0
                    del files
                    push_s = await fleet.weights.push(ref)
                    versions = await fleet.versions()
                    assert set(versions.values()) == {version}, versions
                    delivered = [rec for held in fleet.weights.deliveries.values() for v, rec in held.items() if v == version]
                    row = {"model": name, "placement": args.placement, "transport": transport, "repeat": rep,
                           "version": version, "bytes": size, "export_s": round(export_s, 4),
                           "push_s": round(push_s, 4), "gb_per_s_per_instance": round(size / push_s / 1e9, 3),
                           "nodes": len({s.node.node_id for s in fleet.pool.servers}),
                           "deliveries": [{"node": d["node"], "seconds": round(d["seconds"], 4),
                                           "write_s": round(d["write_s"], 4)} for d in delivered]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    del ref
                    if transport == "shared-fs":
                        shutil.rmtree(out, ignore_errors=True)
    return {"rows": rows}


def _job_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--placement", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--names", nargs="+", required=True)
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    Path(args.out).write_text(json.dumps(asyncio.run(_placement(args))))
    return 0


# ---- the driver: clusters, jobs, the record ------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--job"]:
        return _job_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Run it under the vLLM lock, with the venv's Intel OpenMP preloaded (see above).")
    p.add_argument("--models", default="default,large",
                   help="comma-separated: 'default' / 'tiny' (embedded presets) and 'large' (the 1024x12 Qwen2)")
    p.add_argument("--placements", default="one_node,two_nodes", help=f"comma-separated, of {', '.join(PLACEMENTS)}")
    p.add_argument("--repeats", type=int, default=3, help="pushes per model, placement and transport")
    p.add_argument("--out", type=Path, default=OUT, help="results folder")
    p.add_argument("--render", action="store_true", help="only rewrite weight_push.md from the folder's weight_push.json")
    args = p.parse_args(argv)
    if args.render:
        (args.out / "weight_push.md").write_text(markdown(json.loads((args.out / "weight_push.json").read_text())))
        return 0
    from bench.harness.ray_nodes import RayNodes
    from seer.model import resolve_model

    t_start = time.monotonic()
    names = args.models.split(",")
    models = [str(large_model() if n == "large" else resolve_model(n, progress=False)) for n in names]
    cores = [str(c) for c in sorted(os.sched_getaffinity(0))[:2]]
    tmp = Path(tempfile.mkdtemp(prefix="seer-wp-", dir="/tmp"))
    rows = []
    try:
        for placement in args.placements.split(","):
            ips = PLACEMENTS[placement]
            cluster = RayNodes(tmp / placement).start(ips, cores if len(ips) == 2 else [",".join(cores)])
            try:
                out = tmp / f"{placement}.json"
                cmd = [sys.executable, "-m", "bench.weight_push", "--job", "--placement", placement,
                       "--address", cluster.address, "--names", *names, "--models", *models,
                       "--repeats", str(args.repeats), "--work", str(tmp / f"{placement}-work"), "--out", str(out)]
                job = subprocess.run(cmd, env={**cluster.env(), "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=1200,
                                     capture_output=True, text=True)
                sys.stdout.write("".join(x + "\n" for x in job.stdout.splitlines() if x.startswith(("{", "one", "two"))))
                if job.returncode != 0:
                    raise RuntimeError(f"{placement} job failed ({job.returncode}):\n{job.stdout[-3000:]}\n{job.stderr[-5000:]}")
                rows += json.loads(out.read_text())["rows"]
            finally:
                cluster.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = summarize(rows, args, argv, time.monotonic() - t_start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "weight_push.json").write_text(json.dumps(result, indent=1))
    (args.out / "weight_push.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def summarize(rows: list[dict], args, argv: list[str], elapsed_s: float) -> dict:
    commit, dirty = code_version()
    table = []
    for key in sorted({(r["model"], r["placement"], r["transport"]) for r in rows},
                      key=lambda k: (k[0] != "default", k[0], k[1], k[2] != "shared-fs")):
        rs = [r for r in rows if (r["model"], r["placement"], r["transport"]) == key]
        push = [r["push_s"] for r in rs]
        deliveries = [d["seconds"] for r in rs for d in r["deliveries"]]
        table.append({"model": key[0], "placement": key[1], "transport": key[2], "bytes": rs[0]["bytes"],
                      "pushes": len(rs), "push_s_median": statistics.median(push), "push_s_all": push,
                      "gb_per_s_per_instance_median": round(rs[0]["bytes"] / statistics.median(push) / 1e9, 3),
                      "export_s_median": statistics.median(r["export_s"] for r in rs),
                      "delivery_s_median": statistics.median(deliveries) if deliveries else None})
    return {"bench": "weight_push", "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "uncommitted_changes": dirty, "command": " ".join(["python -m bench.weight_push", *argv]),
            "elapsed_s": round(elapsed_s, 1), "load_average": os.getloadavg(), "large_model": LARGE,
            "table": table, "rows": rows}


def markdown(r: dict) -> str:
    place = {"one_node": "one node (2 instances)", "two_nodes": "two nodes (1 instance each)"}
    lines = [f"# Weight push ({r['date']}, commit {r['commit']}"
             + (", with uncommitted changes" if r["uncommitted_changes"] else "") + ")", "",
             f"`{r['command']}` ({r['elapsed_s']:.0f} s; load average at the end {r['load_average'][0]:.1f})", "",
             "Two vLLM instances (one CPU core each) per fleet; fp32; medians of "
             f"{r['table'][0]['pushes'] if r['table'] else 0} pushes. push = Fleet.weights.push "
             "(delivery + load + cache reset + version check); GB/s per instance = checkpoint bytes / push s; "
             "export = writing the directory (shared-fs) or hashing and `ray.put` (ray); delivery = one node's "
             "fetch, check and write.", "",
             "| model | checkpoint MB | placement | transport | push s | GB/s per instance | export s | delivery s per node |",
             "|---|---|---|---|---|---|---|---|"]
    for t in r["table"]:
        lines.append(f"| {t['model']} | {t['bytes'] / 1e6:.1f} | {place.get(t['placement'], t['placement'])} | "
                     f"{t['transport']} | {t['push_s_median']:.3f} | {t['gb_per_s_per_instance_median']:.2f} | "
                     f"{t['export_s_median']:.3f} | "
                     + (f"{t['delivery_s_median']:.3f}" if t["delivery_s_median"] is not None else "-") + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
