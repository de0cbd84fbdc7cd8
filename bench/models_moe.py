"""Qwen3-MoE under GRPO, with and without routing replay (R3): one `seer-run --sync` iteration each.

Issue 29 item 8: for the untrained tiny Qwen3-MoE preset (float32 on both sides), one iteration's
train-inference log-prob mismatch (mean, max: the trainer's pre-update log-probs against vLLM's on
every trained token) and the share of trained tokens whose experts differ between the rollout and
the trainer's own router (`moe_routing_differ_tokens`, and per (token, layer) decision), with R3
(`trainer.routing_replay`) and without it (`trainer.routing_capture`: the routing is captured and
compared, not replayed), with chunks moving through the KV pool at every chunk (the MoveEveryChunk
test policy) and without the pool (chunks stay with their prefix); then the R3 + moving run with
GSPO (`trainer.policy_loss: gspo`) and with the rollout correction (`trainer.rollout_correction:
token_tis`). Each run starts its own two instances, so the runs are independent samples.

    python -m bench.models_moe [--out bench/results/models/moe]   (seer-bench models-moe)
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MOVE = "seer.scheduler.policies.moving:MoveEveryChunk"
# the untrained model earns no reward on the built-in task: a checksum reward gives every group a
# spread, so each loss (GSPO, the correction) has advantages to work with
BASE = {"model.preset": "tiny-qwen3-moe", "task.reward": "tests.plugins_for_tests:reward_by_checksum",
        "rollout.groups_per_iteration": 4, "rollout.group_size": 4,
        "rollout.max_tokens": 256, "scheduler.chunk_size": 64, "kvpool.capacity_bytes": 64 * 2**20}
MOVING = {"scheduler.policy": MOVE}
STAYING = {"kvpool.enabled": "false"}
RUNS = {  # name -> the run's settings over BASE
    "r3, chunks moving": {"trainer.routing_replay": "true", **MOVING},
    "r3, no pool": {"trainer.routing_replay": "true", **STAYING},
    "no r3, chunks moving": {"trainer.routing_capture": "true", **MOVING},
    "no r3, no pool": {"trainer.routing_capture": "true", **STAYING},
    "r3, chunks moving, gspo": {"trainer.routing_replay": "true", "trainer.policy_loss": "gspo", **MOVING},
    "r3, chunks moving, token_tis": {"trainer.routing_replay": "true", "trainer.rollout_correction": "token_tis",
                                     **MOVING},
}
KEYS = ("logprob_mismatch_mean", "logprob_mismatch_max", "moe_routing_differ_tokens", "moe_routing_differ_decisions",
        "chunks_migrated", "migrated_prefix_tokens_cached", "prefix_tokens_cached", "batch_layout", "pg_loss",
        "tokens", "rollout_is_weight_mean")


def run_one(name: str, sets: dict, work: Path) -> dict:
    run_dir = work / name.replace(", ", "_").replace(" ", "-")
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "1", "--run-dir", str(run_dir)]
    for k, v in {**BASE, **sets}.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{name}: seer-run failed\n{(r.stdout + r.stderr)[-3000:]}")
    (rec,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    row = {"run": name, "settings": sets, "wall_s": round(wall, 1), **{k: rec.get(k) for k in KEYS}}
    row["routing_rows_loaded"] = (rec.get("routing") or {}).get("prefix_rows_loaded")
    return row


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results/models/moe", help="folder for the .json and .md")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated run names (default: all)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.runs.split(",") if n.strip()] if args.runs != ",".join(RUNS) else list(RUNS)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    with tempfile.TemporaryDirectory() as d:
        rows = [run_one(n, RUNS[n], Path(d)) for n in names]
    command = "python -m bench.models_moe" + ("" if names == list(RUNS) else f" --runs '{args.runs}'")
    doc = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit,
           "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores shared with other work",
           "base_settings": BASE, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "models_moe.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Qwen3-MoE: one GRPO iteration with and without routing replay", "",
             f"`{command}` at {commit}, {doc['date']}. The untrained tiny-qwen3-moe preset (2 MoE layers, "
             "8 experts, top-2; float32 in vLLM and the trainer), the built-in task's prompts with a checksum reward "
             "(tests/plugins_for_tests.py), 4 groups of 4, up to 256 tokens, chunks of 64, "
             "two instances; one `seer-run --sync` iteration per row (tree layout). Mismatch: |trainer - vLLM| "
             "log-prob per trained token before the update. Differ: the trainer's own router against the "
             "rollout's experts (before any replay).", "",
             "| run | mismatch mean | mismatch max | differ tokens | differ decisions | chunks moved | "
             "moved prefix tokens cached | routing rows loaded |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {_fmt(r['logprob_mismatch_mean'], '.3g')} | {_fmt(r['logprob_mismatch_max'], '.3g')} | "
              f"{_fmt(r['moe_routing_differ_tokens'], '.4f')} | {_fmt(r['moe_routing_differ_decisions'], '.4f')} | "
              f"{_fmt(r['chunks_migrated'], 'd')} | {_fmt(r['migrated_prefix_tokens_cached'], 'd')} | "
              f"{_fmt(r['routing_rows_loaded'], 'd')} |" for r in rows]
    (out / "models_moe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
