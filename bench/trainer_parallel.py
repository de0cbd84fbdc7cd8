"""The distributed trainer: GRPO step time and gradients at DP=1 / DP=2 / TP=2, and DP=1 vs DP=2 learning.

    flock /tmp/seer-vllm.lock env LD_PRELOAD=.venv/lib/libiomp5.so python -m bench.trainer_parallel

Part 1, steps (no instances): the embedded default model's trainer (seer.trainer.group.TrainerGroup,
one Ray actor per rank, gloo) takes GRPO steps on one fixed synthetic batch (`--sequences` sequences,
response lengths heavy-tailed as in RL rollouts: median ~150, the longest 1000 tokens; advantages of
both signs; rollout log-probs present), at DP=1, DP=2 and TP=2, in two placements:

- one node: Seer's own one-node Ray (seer.fleet.ray_cluster, 127.0.0.2, both cores); the ranks
  share the two cores (DP=1 runs 2 torch threads, DP=2 and TP=2 one thread per rank);
- two nodes: bench.harness.ray_nodes (127.0.0.3 and .4, a core each), STRICT_SPREAD: a rank per node,
  one thread each (DP=1: one rank on one node, one thread).

Per configuration: the first step captures the reduced gradients (both mini-batches, before
clipping), compared with one node's DP=1 on the same step from the same weights; then `--steps`
timed steps (the first step is the warm-up): the rank's step time (TrainMetrics.time_s), the
driver's wall time of the call, and at DP=2 the gradient all-reduce (gloo, including the wait for
the slower rank). The DP shards' tokens per rank (seer.trainer.batching.shard_by_tokens).

Part 2, learning: `seer-run --sync` on the two simulated nodes (an instance and a core each),
trainer.data_parallel 1 vs 2, same seed, `--iterations` iterations, `--groups` groups per
iteration: reward_mean, logprob_mismatch_mean, train_s, weight_sync_s per iteration.

Writes bench/results/trainer_parallel/ (trainer_parallel.json, trainer_parallel.md with the
commands and the commit, step_times.png, learning.png).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.provenance import code_version

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "trainer_parallel"
IPS = ["127.0.0.3", "127.0.0.4"]
# name -> TrainerConfig fields (the embedded default job's lr and mini-batches)
CONFIGS = {"DP=1": {"data_parallel": 1}, "DP=2": {"data_parallel": 2}, "TP=2": {"tensor_parallel": 2}}
BASE = {"lr": 2e-4, "mini_batches": 2, "max_tokens_per_micro_batch": 8192}
PLACEMENTS = ("one_node", "two_nodes")
ATOL, RTOL = 1e-6, 1e-4  # tests/trainer/test_parallel_trainer.py's bound


def synthetic_batch(n: int, seed: int = 0, vocab: int = 320):
    """`n` sequences: prompts of 40-90 tokens, log-normal response lengths (median 150, sigma 0.8,
    clipped to 8..1000, the longest set to 1000), advantages of both signs (an eighth zero),
    rollout log-probs for every response token."""
    from seer.trainer.batching import TrainSequence

    rng = random.Random(seed)
    lengths = [min(1000, max(8, int(rng.lognormvariate(math.log(150), 0.8)))) for _ in range(n)]
    lengths[max(range(n), key=lambda i: lengths[i])] = 1000
    out = []
    for i, r in enumerate(lengths):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(40, 90))]
        resp = [rng.randrange(3, vocab) for _ in range(r)]
        adv = 0.0 if i % 8 == 7 else rng.uniform(-1.5, 1.5)
        out.append(TrainSequence(prompt, resp, advantage=adv, rollout_logprobs=[-rng.uniform(0.01, 3.0) for _ in resp]))
    return out


# ---- functions run on every rank (group.apply) ---------------------------------------------------
def _share(trainer, seqs):
    mine = trainer._my_share(seqs, [s.length for s in seqs])
    return {"rank": trainer.place.rank, "dp_rank": trainer.dp_rank, "sequences": len(mine),
            "tokens": sum(s.length for s in mine), "trained_tokens": sum(s.trained_tokens for s in mine),
            "micro_batches": len(trainer._micro_batches(mine)) if mine else 0}


def _instrument(trainer):
    """Time the gradient all-reduce (it includes waiting for the slower rank)."""
    orig = trainer._reduce_grads
    trainer.reduce_s = []

    def timed():
        t0 = time.perf_counter()
        orig()
        trainer.reduce_s.append(time.perf_counter() - t0)

    trainer._reduce_grads = timed
    import torch

    return torch.get_num_threads()


def _capture(trainer, seqs, path):
    trainer.captured_grads = []
    m = trainer.train_sequences(seqs)
    grads, trainer.captured_grads = trainer.captured_grads, None
    if trainer.is_writer:
        import torch

        torch.save(grads, path)
    return m.time_s


def _step(trainer, seqs):
    trainer.reduce_s = []
    m = trainer.train_sequences(seqs)
    return {"time_s": m.time_s, "reduce_s": sum(trainer.reduce_s), "loss": m.loss, "tokens": m.tokens,
            "grad_norm": m.grad_norm}


# ---- part 1, one placement, in a process of its own (a process joins one Ray only) ---------------
def _steps_job(args) -> dict:
    from seer.fleet.config import ClusterConfig
    from seer.fleet.ray_cluster import RayCluster
    from seer.model import resolve_model

    two = args.placement == "two_nodes"
    cfg = ClusterConfig(address=args.address, node_ip=IPS[0]) if two else ClusterConfig()
    cluster = RayCluster.connect(cfg, args.work)
    import ray

    from seer.trainer.config import TrainerConfig
    from seer.trainer.group import TrainerGroup

    if __name__ != "__main__":
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    model = str(resolve_model("default", progress=False))
    seqs = synthetic_batch(args.sequences)
    rows = []
    try:
        for name in args.configs:
            t0 = time.monotonic()
            tc = TrainerConfig(**BASE, **CONFIGS[name], placement_strategy="STRICT_SPREAD" if two else "PACK")
            group = TrainerGroup.start(model, tc)
            try:
                startup = time.monotonic() - t0
                threads = group.apply(_instrument)
                shares = group.apply(lambda t: _share(t, seqs))
                grads = Path(args.work) / f"grads-{args.placement}-{name.replace('=', '')}.pt"
                t1 = time.monotonic()
                first = group.apply(lambda t: _capture(t, seqs, str(grads)))[0]
                first_wall = time.monotonic() - t1
                steps = []
                for k in range(args.steps):
                    t1 = time.monotonic()
                    per_rank = group.apply(lambda t: _step(t, seqs))
                    steps.append({"wall_s": time.monotonic() - t1, "ranks": per_rank})
                    print(f"{args.placement} {name} step {k + 1}/{args.steps}: {steps[-1]['wall_s']:.2f} s "
                          f"(rank 0 {per_rank[0]['time_s']:.2f} s, all-reduce {per_rank[0]['reduce_s']:.2f} s)",
                          flush=True)
                rows.append({"placement": args.placement, "config": name, "trainer": {**BASE, **CONFIGS[name]},
                             "world_size": tc.world_size, "startup_s": startup, "describe": group.describe(),
                             "ranks": [{"rank": r.rank, "ip": r.ip, "cores": list(r.cores), "threads": r.threads,
                                        "torch_threads": th} for r, th in zip(group.infos, threads)],
                             "shards": shares, "first_step_s": first, "first_step_wall_s": first_wall,
                             "steps": steps, "grads": str(grads)})
                print(f"{args.placement} {name}: {group.describe()}; started in {startup:.1f} s", flush=True)
            finally:
                group.close()
    finally:
        cluster.close()
    return {"rows": rows}


def _job_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--placement", required=True)
    p.add_argument("--address", default=None)
    p.add_argument("--configs", nargs="+", required=True)
    p.add_argument("--sequences", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    Path(args.out).write_text(json.dumps(_steps_job(args)))
    return 0


def grad_diff(path: str, ref_path: str) -> list[dict]:
    """Per mini-batch: max over tensors of max|g - g_ref| / max|g_ref|, the whole-model relative L2
    difference, and the elements outside the tests' bound (1e-6 + 1e-4 |g_ref|)."""
    import torch

    got, ref = torch.load(path), torch.load(ref_path)
    out = []
    for g, r in zip(got, ref):
        assert g.keys() == r.keys()
        worst, worst_name, num, den, outside, total = 0.0, "", 0.0, 0.0, 0, 0
        for name in r:
            d = (g[name].double() - r[name].double()).abs()
            scale = float(r[name].abs().max())
            rel = float(d.max()) / scale if scale > 0 else float(d.max())
            if rel > worst:
                worst, worst_name = rel, name
            num += float((d ** 2).sum())
            den += float((r[name].double() ** 2).sum())
            outside += int((d > ATOL + RTOL * r[name].double().abs()).sum())
            total += d.numel()
        out.append({"max_rel_per_tensor": worst, "worst_tensor": worst_name, "rel_l2": math.sqrt(num / den),
                    "outside_test_bound": outside, "elements": total})
    return out


# ---- part 2: seer-run DP=1 vs DP=2 on two nodes ---------------------------------------------------
def learning_sets(args, address: str, dp: int) -> dict:
    return {"rollout.groups_per_iteration": args.groups, "trainer.data_parallel": dp,
            "cluster.address": address, "cluster.node_ip": IPS[0], "cluster.placement_strategy": "STRICT_SPREAD",
            "trainer.placement_strategy": "STRICT_SPREAD"}


def run_learning(run_dir: Path, sets: dict, env: dict, iterations: int) -> dict:
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", str(iterations), "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"seer-run failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    text = (run_dir / "run.log").read_text()
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ("reward_mean", "logprob_mismatch_mean", "logprob_mismatch_max", "train_s", "weight_sync_s", "wall_s",
            "loss", "grad_norm", "entropy", "output_tokens", "len_p50", "len_max", "train_ranks")
    trainer = re.search(r"trainer: \d+ rank\(s\).*", text)
    return {"wall_s": round(time.monotonic() - t0, 1), "trainer": trainer.group(0) if trainer else None,
            "instances": sorted(set(re.findall(r"inst\d+ on node (\S+) ", text))),
            "iterations": [{"iteration": r["iteration"], **{k: r.get(k) for k in keys}} for r in recs]}


# ---- the driver --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--job"]:
        return _job_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Run it under the vLLM lock, with the venv's Intel OpenMP preloaded (see above).")
    p.add_argument("--parts", default="steps,learning", help="comma-separated: steps (part 1), learning (part 2)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"part 1's trainer worlds, of {', '.join(CONFIGS)}")
    p.add_argument("--placements", default=",".join(PLACEMENTS), help=f"part 1's placements, of {', '.join(PLACEMENTS)}")
    p.add_argument("--sequences", type=int, default=64, help="sequences in part 1's synthetic batch")
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration, after the first (warm-up) step")
    p.add_argument("--iterations", type=int, default=5, help="seer-run iterations per learning run (part 2)")
    p.add_argument("--groups", type=int, default=8, help="rollout.groups_per_iteration of the learning runs (default job: 16)")
    p.add_argument("--out", type=Path, default=OUT, help="results folder")
    p.add_argument("--render", action="store_true", help="only rewrite the md and the plots from the folder's json")
    args = p.parse_args(argv)
    if args.render:
        result = json.loads((args.out / "trainer_parallel.json").read_text())
        write(result, args.out)
        return 0
    from bench.harness.ray_nodes import RayNodes

    t_start = time.monotonic()
    parts = args.parts.split(",")
    cores = [str(c) for c in sorted(os.sched_getaffinity(0))[:2]]
    tmp = Path(tempfile.mkdtemp(prefix="seer-tp-", dir="/tmp"))
    nodes = RayNodes(tmp / "nodes")
    commit, dirty = code_version()
    result = {"bench": "trainer_parallel", "date": time.strftime("%Y-%m-%d"), "commit": commit,
              "uncommitted_changes": dirty, "command": " ".join(["python -m bench.trainer_parallel", *argv]),
              "settings": {"sequences": args.sequences, "steps": args.steps, "iterations": args.iterations,
                           "groups": args.groups, "trainer": BASE, "cores": cores},
              "steps": None, "learning": None}
    try:
        if "two_nodes" in args.placements or "learning" in parts:
            nodes.start(IPS, cores)
            print(f"two simulated nodes: {nodes.address} ({', '.join(f'{n.ip} core {n.cores}' for n in nodes.nodes)})",
                  flush=True)
        if "steps" in parts:
            batch = synthetic_batch(args.sequences)
            lengths = [s.length for s in batch]
            rows = []
            for placement in args.placements.split(","):
                out = tmp / f"{placement}.json"
                cmd = [sys.executable, "-m", "bench.trainer_parallel", "--job", "--placement", placement,
                       "--configs", *args.configs.split(","), "--sequences", str(args.sequences),
                       "--steps", str(args.steps), "--work", str(tmp), "--out", str(out)]
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                if placement == "two_nodes":
                    cmd += ["--address", nodes.address]
                    env = {**nodes.env(), "PYTHONPATH": str(ROOT)}
                print(f"part 1, {placement}: {', '.join(args.configs.split(','))}", flush=True)
                job = subprocess.run(cmd, env=env, cwd=ROOT, timeout=1500, capture_output=True, text=True)
                sys.stdout.write("".join(x + "\n" for x in job.stdout.splitlines() if x.startswith(placement)))
                if job.returncode != 0:
                    raise RuntimeError(f"{placement} job failed ({job.returncode}):\n{job.stdout[-3000:]}\n{job.stderr[-5000:]}")
                rows += json.loads(out.read_text())["rows"]
            ref = next((r["grads"] for r in rows if (r["placement"], r["config"]) == ("one_node", "DP=1")), None)
            for r in rows:
                r["grad_vs_one_node_dp1"] = grad_diff(r["grads"], ref) if ref else None
                same = next(x["grads"] for x in rows if (x["placement"], x["config"]) == (r["placement"], "DP=1"))
                r["grad_vs_same_placement_dp1"] = grad_diff(r["grads"], same)
                walls = [s["wall_s"] for s in r["steps"]]
                r["step_s_median"] = statistics.median(s["ranks"][0]["time_s"] for s in r["steps"])
                r["wall_s_median"] = statistics.median(walls)
                # the rank that arrives last waits for no one: its all-reduce is the transfer; the
                # other's is the transfer plus the wait for the slower shard
                r["reduce_s_median"] = statistics.median(min(x["reduce_s"] for x in s["ranks"]) for s in r["steps"])
                r["reduce_wait_s_median"] = statistics.median(max(x["reduce_s"] for x in s["ranks"]) for s in r["steps"])
            for r in rows:
                del r["grads"]
            result["steps"] = {"batch": {"sequences": len(batch), "tokens": sum(lengths),
                                         "response_tokens": sum(s.trained_tokens for s in batch),
                                         "response_len_median": statistics.median(len(s.response_ids) for s in batch),
                                         "response_len_p90": sorted(len(s.response_ids) for s in batch)[int(0.9 * len(batch))],
                                         "response_len_max": max(len(s.response_ids) for s in batch)},
                               "rows": rows}
        if "learning" in parts:
            runs = {}
            for dp in (1, 2):
                name = f"DP={dp}"
                print(f"part 2: seer-run --sync {name}, {args.iterations} iterations, {args.groups} groups", flush=True)
                sets = learning_sets(args, nodes.address, dp)
                runs[name] = run_learning(tmp / f"run-dp{dp}", sets, nodes.env(), args.iterations)
                runs[name]["command"] = ("python -m seer.cli --sync --iterations " + str(args.iterations) + " "
                                         + " ".join(f"--set {k}={v}" for k, v in sets.items()
                                                    if k not in ("cluster.address",))
                                         + " --set cluster.address=<the two nodes' GCS>")
                for it in runs[name]["iterations"]:
                    print(f"  {name} iteration {it['iteration']}: reward {it['reward_mean']:.3f}, mismatch "
                          f"{it['logprob_mismatch_mean']:.2e}, train {it['train_s']:.1f} s, sync "
                          f"{(it['weight_sync_s'] or 0):.2f} s", flush=True)
            result["learning"] = runs
    finally:
        nodes.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - t_start, 1)
    result["load_average"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trainer_parallel.json").write_text(json.dumps(result, indent=1))
    write(result, args.out)
    print((args.out / "trainer_parallel.md").read_text())
    return 0


# ---- the record ----------------------------------------------------------------------------------
PLACE = {"one_node": "one node (2 cores shared)", "two_nodes": "two nodes (a core each)"}


def _threads(r: dict) -> str:
    return "+".join(str(x["threads"]) for x in r["ranks"])


def _tokens(r: dict) -> str:
    if r["config"].startswith("DP") and len(r["shards"]) > 1:
        return " / ".join(str(s["tokens"]) for s in r["shards"])
    return f"{r['shards'][0]['tokens']} (whole batch" + (", every rank)" if len(r["shards"]) > 1 else ")")


def markdown(r: dict) -> str:
    lines = [f"# The distributed trainer ({r['date']}, commit {r['commit']}"
             + (", with uncommitted changes" if r["uncommitted_changes"] else "") + ")", "",
             f"`{r['command']}` ({r.get('elapsed_s', 0):.0f} s; load average at the end "
             f"{r.get('load_average', [0])[0]:.1f})", ""]
    st = r.get("steps")
    if st:
        b = st["batch"]
        lines += ["## GRPO step time and gradients", "",
                  f"The embedded default model (fp32), one GRPO step (2 mini-batches, lr 2e-4, micro-batches of at "
                  f"most 8192 padded tokens) on a fixed synthetic batch: {b['sequences']} sequences, {b['tokens']} "
                  f"tokens ({b['response_tokens']} response tokens; response length median {b['response_len_median']:.0f},"
                  f" p90 {b['response_len_p90']}, max {b['response_len_max']}). step s = the rank's train step "
                  f"(median of {r['settings']['steps']} after a warm-up step), call s = the driver's wall time of "
                  f"the call on every rank, all-reduce s = the DP gradient all-reduce per step (gloo, both "
                  f"mini-batches) on the rank that arrives last (the transfer) / on the other (the transfer and "
                  f"its wait for the slower shard). Gradient difference: the first step's "
                  f"reduced gradients (mini-batch 0, from the same initial weights) against one node's DP=1, "
                  f"max over tensors of max|g - g_DP1| / max|g_DP1|; in brackets the elements outside the trainer "
                  f"tests' bound 1e-6 + 1e-4 |g_DP1|.", "",
                  "| placement | world | threads per rank | step s | call s | vs one-node DP=1 | all-reduce s | "
                  "tokens per DP rank | gradient difference vs DP=1 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        base = next((x["step_s_median"] for x in st["rows"] if (x["placement"], x["config"]) == ("one_node", "DP=1")),
                    None)
        for x in st["rows"]:
            d = x["grad_vs_one_node_dp1"][0] if x["grad_vs_one_node_dp1"] else None
            diff = "-" if d is None else ("0 (reference)" if (x["placement"], x["config"]) == ("one_node", "DP=1")
                                          else f"{d['max_rel_per_tensor']:.1e} ({d['outside_test_bound']})")
            lines.append(f"| {PLACE[x['placement']]} | {x['config']} | {_threads(x)} | {x['step_s_median']:.2f} | "
                         f"{x['wall_s_median']:.2f} | {x['step_s_median'] / base:.2f}x | "
                         + (f"{x['reduce_s_median']:.3f} / {x['reduce_wait_s_median']:.3f}" if x["config"].startswith("DP") and x["world_size"] > 1 else "-")
                         + f" | {_tokens(x)} | {diff} |")
        lines += ["", "Mini-batch 0, the whole model's relative L2 difference: " + ", ".join(
            f"{PLACE[x['placement']].split(' (')[0]} {x['config']} {x['grad_vs_one_node_dp1'][0]['rel_l2']:.1e}"
            for x in st["rows"] if x["grad_vs_one_node_dp1"] and (x["placement"], x["config"]) != ("one_node", "DP=1"))
            + ".", "", "Mini-batch 1 (taken after one Adam step, which magnifies float32 summation noise), same "
                  "measure: " + ", ".join(
                      f"{PLACE[x['placement']].split(' (')[0]} {x['config']} {x['grad_vs_one_node_dp1'][1]['max_rel_per_tensor']:.1e} "
                      f"(relative L2 {x['grad_vs_one_node_dp1'][1]['rel_l2']:.1e})"
                      for x in st["rows"] if x["grad_vs_one_node_dp1"] and len(x["grad_vs_one_node_dp1"]) > 1
                      and (x["placement"], x["config"]) != ("one_node", "DP=1")) + ".", ""]
    lr = r.get("learning")
    if lr:
        s = r["settings"]
        lines += ["## Learning: seer-run DP=1 vs DP=2 on two nodes", "",
                  f"`seer-run --sync`, the embedded default model and task, {s['iterations']} iterations of "
                  f"{s['groups']} groups (the default job has 16), seed 0, on the two simulated nodes (an instance "
                  "and a core each; STRICT_SPREAD for the instances and the trainer's ranks). train s and sync s "
                  "as seer-run records them (metrics.jsonl).", ""]
        for name, run in lr.items():
            lines.append(f"- {name}: `{run['command']}` ({run['wall_s']:.0f} s); {run['trainer']}")
        lines += ["", "| iter | reward DP=1 | reward DP=2 | mismatch DP=1 | mismatch DP=2 | train s DP=1 | "
                  "train s DP=2 | sync s DP=1 | sync s DP=2 |", "|---|---|---|---|---|---|---|---|---|"]
        a, b = lr["DP=1"]["iterations"], lr["DP=2"]["iterations"]

        def f(v, fmt):
            return "-" if v is None else fmt.format(v)

        for x, y in zip(a, b):
            lines.append(f"| {x['iteration']} | {f(x['reward_mean'], '{:.3f}')} | {f(y['reward_mean'], '{:.3f}')} | "
                         f"{f(x['logprob_mismatch_mean'], '{:.2e}')} | {f(y['logprob_mismatch_mean'], '{:.2e}')} | "
                         f"{f(x['train_s'], '{:.1f}')} | {f(y['train_s'], '{:.1f}')} | "
                         f"{f(x['weight_sync_s'], '{:.2f}')} | {f(y['weight_sync_s'], '{:.2f}')} |")
    return "\n".join(lines) + "\n"


def plot(r: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st = r.get("steps")
    if st:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        rows = st["rows"]
        labels = [f"{x['config']}\n{PLACE[x['placement']].split(' (')[0]}" for x in rows]
        colors = ["tab:blue" if x["placement"] == "one_node" else "tab:orange" for x in rows]
        ax.bar(range(len(rows)), [x["step_s_median"] for x in rows], color=colors)
        red = [x["reduce_s_median"] if x["config"].startswith("DP") and x["world_size"] > 1 else 0 for x in rows]
        ax.bar(range(len(rows)), red, color="black", alpha=0.35, label="of which DP all-reduce (the last rank's)")
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_ylabel("GRPO step s (median)")
        ax.set_title(f"{st['batch']['sequences']} sequences, {st['batch']['tokens']} tokens: blue one node "
                     "(2 cores shared), orange two nodes (a core each)", fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "step_times.png", dpi=110)
        plt.close(fig)
    lr = r.get("learning")
    if lr:
        keys = [("reward_mean", "reward mean"), ("logprob_mismatch_mean", "logprob mismatch mean"),
                ("train_s", "train s"), ("weight_sync_s", "weight sync s")]
        fig, axes = plt.subplots(1, 4, figsize=(13, 3.2))
        for ax, (k, title) in zip(axes, keys):
            for name, run in lr.items():
                its = [it for it in run["iterations"] if it.get(k) is not None]
                ax.plot([it["iteration"] for it in its], [it[k] for it in its], marker="o", label=name)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("iteration")
        axes[0].legend(fontsize=8)
        fig.suptitle("seer-run --sync on two simulated nodes: trainer.data_parallel 1 vs 2", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "learning.png", dpi=110)
        plt.close(fig)


def write(result: dict, out: Path) -> None:
    (out / "trainer_parallel.md").write_text(markdown(result))
    plot(result, out)


if __name__ == "__main__":
    sys.exit(main())
