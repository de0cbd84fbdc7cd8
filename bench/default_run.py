"""Record a finished `seer-run --sync` (the default run of `make run`) as the README quotes it.

    python -m bench.default_run runs/latest --command "make run" --note "fresh clone, model cached"

Writes bench/results/default_run/: the run's metrics.jsonl and iterations.png, and default_run.md
with the per-iteration table (reward, its spread, the share of samples scoring 0 and 1 from
rollouts/iter_*.jsonl, lengths, rollout and train times) and the command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

OUT = Path("bench/results/default_run")
COLUMNS = ["iter", "reward", "±", "reward 0", "reward 1", "len p50", "len p99", "rollout s", "tok/s", "tail s",
           "train s", "sync s"]


def rows(run_dir: Path) -> list[list[str]]:
    out = []
    for rec in (json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()):
        it = rec["iteration"]
        rewards = [json.loads(x)["reward"] or 0.0
                   for x in (run_dir / "rollouts" / f"iter_{it:04d}.jsonl").read_text().splitlines()]
        share = lambda pred: f"{100 * sum(map(pred, rewards)) / len(rewards):.1f}%"  # noqa: E731
        out.append([str(it), f"{rec['reward_mean']:.3f}", f"{rec['reward_std']:.3f}", share(lambda r: r == 0),
                    share(lambda r: r == 1), f"{rec['len_p50']:.0f}", f"{rec['len_p99']:.0f}", f"{rec['wall_s']:.1f}",
                    f"{rec['tokens_per_s']:.0f}", f"{rec['tail_s']:.1f}", f"{rec.get('train_s') or 0:.1f}",
                    f"{rec.get('weight_sync_s') or 0:.1f}"])
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="the run directory `make run` wrote (runs/<date>-<time>)")
    p.add_argument("--command", required=True, help="what produced the run, as typed")
    p.add_argument("--wall", default="", help="its wall time, e.g. '4 min 26 s'")
    p.add_argument("--note", default="", help="a remark recorded with the result (the machine's load, …)")
    p.add_argument("--out", type=Path, default=OUT, help="where the result's markdown, metrics and plot go")
    args = p.parse_args(argv)
    run = args.run_dir.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / "metrics.jsonl", args.out / "metrics.jsonl")
    shutil.copy(run / "iterations.png", args.out / "iterations.png")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(r) + " |" for r in rows(run)]
    (args.out / "default_run.md").write_text(
        f"# The default run ({time.strftime('%Y-%m-%d', time.gmtime((run / 'metrics.jsonl').stat().st_mtime))}, "
        f"commit {commit})\n\n`{args.command}`" + (f": {args.wall}" if args.wall else "") +
        (f"; {args.note}" if args.note else "") + "\n\n" + "\n".join(table) + "\n\n"
        "(reward 0 / reward 1: share of the iteration's samples scoring 0 and 1, from rollouts/iter_*.jsonl.)\n")
    print((args.out / "default_run.md").read_text())


if __name__ == "__main__":
    main()
