"""Each model family end to end: log-prob mismatch, train step time, and learning against lr=0.

For each family's warm-started preset (Qwen2 = the embedded default, Qwen3, Llama 3, Qwen3-MoE)
this runs `seer-run --sync` for a few iterations at the embedded models' lr and
again at lr=0 (the control: same rollouts, weights never move), and records per family the
train-inference log-prob mismatch (iteration 0's, and every iteration's), the trainer's step time,
the reward per iteration of both arms and each run's wall time.

    python -m bench.models [--iterations 5] [--families qwen2,qwen3,llama3,qwen3-moe] [--merge]   (seer-bench models)

`--merge` re-records only the named families and keeps the other rows of the recorded models.json
(each row says the commit and date it was measured at).

It starts vLLM instances, Ray and the trainer: run it alone (on the shared box: `/work/heavy`).
Writes bench/results/models/families/: models.json, models.md, rewards.png, and logs/ (this
bench's progress log and each run's seer-run output; not recorded).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

OUT = Path("bench/results/models/families")
# The presets' own model sizes, with a quarter of the default job's samples: 8 prompts (the same
# 8 every iteration, as the default's 16 are) x 8 samples. The default's 256 samples and their ~50 s
# GRPO step would put the 6 learning runs well past half an hour on two shared cores.
COMMON_SETS = ("task.num_prompts=8", "rollout.groups_per_iteration=8", "rollout.group_size=8")


@dataclass(frozen=True)
class Family:
    """One model family as this bench runs it: its preset, whether it can learn the task (warm
    started), and any settings beyond COMMON_SETS (why, in `note`)."""

    name: str
    preset: str
    learns: bool = True
    sets: tuple[str, ...] = ()
    note: str = ""


FAMILIES = {
    "qwen2": Family("qwen2", "default"),
    "qwen3": Family("qwen3", "qwen3"),
    "llama3": Family("llama3", "llama3"),
    "qwen3-moe": Family("qwen3-moe", "qwen3-moe"),
}


@dataclass
class RunSummary:
    """One seer-run's iterations, as parsed from its metrics.jsonl (the fields this bench reports)."""

    iterations: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    mismatch_mean: list[float | None] = field(default_factory=list)
    mismatch_max: list[float | None] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    moe_load_max: list[float | None] = field(default_factory=list)


def _num(x) -> float | None:
    """A recorded float, None where the record has none (or NaN: no token was trained)."""
    return None if x is None or math.isnan(float(x)) else float(x)


def summarize(records: list[dict]) -> RunSummary:
    """The run's per-iteration numbers, in iteration order (a record without training, as with
    `--train off`, has no mismatch or step time: None / 0)."""
    s = RunSummary()
    for rec in sorted(records, key=lambda r: r["iteration"]):
        s.iterations.append(int(rec["iteration"]))
        s.reward.append(float(rec["reward_mean"]))
        s.mismatch_mean.append(_num(rec.get("logprob_mismatch_mean")))
        s.mismatch_max.append(_num(rec.get("logprob_mismatch_max")))
        s.train_s.append(float(rec.get("train_s") or 0.0))
        s.rollout_s.append(float(rec["wall_s"]))
        s.samples.append(int(rec["num_samples"]))
        s.output_tokens.append(int(rec["output_tokens"]))
        s.moe_load_max.append(rec.get("moe_load_max"))
    return s


def read_records(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    if not p.is_file():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def family_row(fam: Family, lr: float, trained: dict, control: dict | None) -> dict:
    """A family's line of the result: iteration 0's mismatch, every iteration's, the step time,
    and the reward change of each arm (last iteration minus iteration 0)."""
    t = trained["summary"]
    row = {"family": fam.name, "preset": fam.preset, "learns": fam.learns, "lr": lr, "note": fam.note,
           "trained": trained, "control": control}
    if t is not None and t["iterations"]:
        row.update(mismatch_mean_iter0=t["mismatch_mean"][0], mismatch_max_iter0=t["mismatch_max"][0],
                   mismatch_mean_all=_mean_finite(t["mismatch_mean"]), mismatch_max_all=_max_finite(t["mismatch_max"]),
                   train_s_mean=sum(t["train_s"]) / len(t["train_s"]),
                   reward_gain_trained=t["reward"][-1] - t["reward"][0])
    c = control["summary"] if control else None
    if c is not None and c["iterations"]:
        row["reward_gain_control"] = c["reward"][-1] - c["reward"][0]
        if t is not None and t["iterations"]:
            row["reward_last_trained_minus_control"] = t["reward"][-1] - c["reward"][-1]
    return row


def merge_rows(old: dict, new: list[dict]) -> list[dict]:
    """The recorded doc's rows with the families of `new` replaced (or added at the end); a kept
    row without its own commit and date takes its doc's, so every row says when it was measured."""
    fresh = {r["family"]: r for r in new}
    rows = [fresh.pop(r["family"], None) or {"commit": old["commit"], "date": old["date"], **r} for r in old["families"]]
    return rows + list(fresh.values())


def _mean_finite(v: list[float]) -> float | None:
    v = [x for x in v if x is not None and not math.isnan(x)]
    return sum(v) / len(v) if v else None


def _max_finite(v: list[float]) -> float | None:
    v = [x for x in v if x is not None and not math.isnan(x)]
    return max(v) if v else None


def _sci(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2e}"


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _rewards(arm: dict | None) -> str:
    if not arm:
        return "not run"
    if arm["summary"] is None or not arm["summary"]["iterations"]:
        return f"failed (rc {arm['rc']})"
    return " → ".join(f"{r:.3f}" for r in arm["summary"]["reward"])


def markdown(doc: dict) -> str:
    """models.md: the summary table, the rewards per iteration, and how they were produced."""
    lines = ["# The model families end to end: mismatch, step time, learning against lr=0", "",
             f"`{doc['command']}` at {doc['commit']}{' (uncommitted changes under seer/ or bench/)' if doc['dirty'] else ''}, "
             f"{doc['date']}; {doc['wall_s'] / 60:.1f} min in all. Load average (1/5/15 min) at the start "
             f"{' / '.join(f'{x:.2f}' for x in doc['load_start'])}, at the end {' / '.join(f'{x:.2f}' for x in doc['load_end'])} "
             f"({doc['machine']}).", "",
             f"Each run: `seer-run --sync --iterations {doc['iterations']} --set model.preset=PRESET --set trainer.lr=LR "
             + " ".join(f"--set {s}" for s in doc["common_sets"]) + "` (+ the family's own settings below), "
             f"trained at lr={doc['lr']:g} (the embedded models' GRPO lr, `seer/config.py` EMBEDDED_MODEL_TRAINER; "
             "the presets carry no lr of their own) and at lr=0, the control. Mismatch: mean and max |trainer "
             "log-prob - rollout log-prob| over the trained tokens, before the update (the trained arm's "
             "records). Step s: the trainer's step, mean over the trained arm's iterations.", "",
             "| family | preset | iter 0 mismatch mean / max | all iterations mismatch mean / max | train step s | "
             "reward gain trained / lr=0 | last reward trained - lr=0 | wall s trained / lr=0 |",
             "|---|---|---|---|---|---|---|---|"]
    measured = {}
    for r in doc["families"]:
        measured.setdefault((r.get("commit", doc["commit"]), r.get("date", doc["date"])), []).append(r["family"])
    if len(measured) > 1:  # a --merge: say which rows came from which run
        lines[2] = "Rows measured at different commits: " + "; ".join(
            f"{', '.join(fams)} at {c} ({d})" for (c, d), fams in measured.items()
        ) + f". The latest run: {lines[2]}"
    for r in doc["families"]:
        c = r.get("control")
        lines.append(
            f"| {r['family']} | `{r['preset']}` | {_sci(r.get('mismatch_mean_iter0'))} / {_sci(r.get('mismatch_max_iter0'))} | "
            f"{_sci(r.get('mismatch_mean_all'))} / {_sci(r.get('mismatch_max_all'))} | {_f(r.get('train_s_mean'), '.1f')} | "
            f"{_f(r.get('reward_gain_trained'), '+.3f')} / {_f(r.get('reward_gain_control'), '+.3f')} | "
            f"{_f(r.get('reward_last_trained_minus_control'), '+.3f')} | "
            f"{r['trained']['wall_s']:.0f} / {c['wall_s']:.0f} |" if c else
            f"| {r['family']} | `{r['preset']}` | {_sci(r.get('mismatch_mean_iter0'))} / {_sci(r.get('mismatch_max_iter0'))} | "
            f"{_sci(r.get('mismatch_mean_all'))} / {_sci(r.get('mismatch_max_all'))} | {_f(r.get('train_s_mean'), '.1f')} | "
            f"{_f(r.get('reward_gain_trained'), '+.3f')} / - | - | {r['trained']['wall_s']:.0f} / - |")
    lines += ["", "Reward per iteration (mean over the iteration's samples):", "",
              "| family | trained | lr=0 |", "|---|---|---|"]
    lines += [f"| {r['family']} | {_rewards(r['trained'])} | {_rewards(r.get('control')) if r['learns'] else 'not run (untrained model)'} |"
              for r in doc["families"]]
    lines += ["", "Per family:", ""]
    for r in doc["families"]:
        sets = " ".join(f"--set {s}" for s in r["trained"]["sets"])
        lines.append(f"- **{r['family']}** (`{r['preset']}`): `{sets}`" + (f"; {r['note']}" if r["note"] else ""))
        for arm in ("trained", "control"):
            a = r.get(arm)
            if a and a["rc"] != 0:
                lines.append(f"  - the {arm} run failed (rc {a['rc']}): `{a['error']}`")
    lines += ["", "![reward per iteration](rewards.png)", ""]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = doc["families"]
    # one reward scale for every family, so a family that stays near 0 looks it
    fig, axes = plt.subplots(1, len(fams), figsize=(4 * len(fams), 3.4), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], fams):
        for arm, style in (("trained", "-o"), ("control", "--s")):
            a = r.get(arm)
            if a and a["summary"] and a["summary"]["iterations"]:
                label = f"lr={r['lr']:g}" if arm == "trained" else "lr=0"
                ax.plot(a["summary"]["iterations"], a["summary"]["reward"], style, label=label)
        ax.set_title(f"{r['family']} ({r['preset']})", fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("reward (mean)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Log:
    """Progress lines on stdout and in the bench's log file."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = path.open("a")

    def __call__(self, msg: str) -> None:
        line = f"[models {time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def run_arm(fam: Family, lr: float, iterations: int, runs: Path, logs: Path, timeout_s: float, log: Log) -> dict:
    """One `seer-run --sync` of the family at `lr`; its output goes to logs/<family>-lr<lr>.log."""
    tag = f"{fam.name}-lr{lr:g}"
    run_dir = runs / tag
    sets = (f"model.preset={fam.preset}", f"trainer.lr={lr:g}", *COMMON_SETS, *fam.sets)
    cmd = ["seer-run", "--sync", "--iterations", str(iterations), "--run-dir", str(run_dir), "--overwrite"]
    for s in sets:
        cmd += ["--set", s]
    log(f"{tag}: {shlex.join(cmd)}")
    t0 = time.monotonic()
    seen = 0
    # an earlier run's records, until seer-run's --overwrite clears the folder, are not this run's
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    with (logs / f"{tag}.log").open("w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while p.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    log(f"{tag}: past {timeout_s:.0f} s, stopping it")
                    os.killpg(p.pid, 15)
                    try:
                        p.wait(60)
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, 9)
                        p.wait()
                    break
                time.sleep(3)
                seen = _progress(tag, run_dir, seen, iterations, t0, log)
        except BaseException:
            os.killpg(p.pid, 15)
            p.wait()
            raise
    wall = time.monotonic() - t0
    _progress(tag, run_dir, seen, iterations, t0, log)
    rc = p.returncode
    records = read_records(run_dir)
    error = ""
    if rc != 0:
        tail = [x for x in (logs / f"{tag}.log").read_text(errors="replace").splitlines() if x.strip()]
        error = tail[-1][:300] if tail else ""
        log(f"{tag}: FAILED rc={rc}: {error}")
    log(f"{tag}: done in {wall:.0f} s, {len(records)} iterations recorded")
    return {"lr": lr, "sets": list(sets), "command": shlex.join(cmd[:2] + cmd[2:4] + cmd[7:]), "rc": rc,
            "error": error, "wall_s": round(wall, 1), "summary": asdict(summarize(records)) if records else None}


def _progress(tag: str, run_dir: Path, seen: int, iterations: int, t0: float, log: Log) -> int:
    recs = read_records(run_dir)
    for rec in recs[seen:]:
        log(f"{tag}: iteration {rec['iteration'] + 1}/{iterations}: reward {rec['reward_mean']:.3f}, "
            f"mismatch {_sci(rec.get('logprob_mismatch_mean'))} / {_sci(rec.get('logprob_mismatch_max'))}, "
            f"rollout {rec['wall_s']:.1f} s, train {rec.get('train_s') or 0:.1f} s "
            f"({time.monotonic() - t0:.0f} s so far)")
    return max(seen, len(recs))


def main(argv: list[str] | None = None) -> None:
    from seer.config import EMBEDDED_MODEL_TRAINER
    from seer.model.presets import PRESETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=5, help="GRPO iterations per run (each family: trained and lr=0)")
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    p.add_argument("--lr", type=float, default=EMBEDDED_MODEL_TRAINER["lr"],
                   help="the trained arm's lr (default: the embedded models' GRPO lr)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one seer-run may take before it is stopped")
    p.add_argument("--runs", type=Path, default=Path("/tmp/seer-bench-models"), help="where the runs' directories go")
    p.add_argument("--out", type=Path, default=OUT, help="folder for models.json, models.md, rewards.png and logs/")
    p.add_argument("--merge", action="store_true",
                   help="keep the recorded rows (models.json in --out) of the families not run this time")
    p.add_argument("--replot", action="store_true",
                   help="run nothing: rewrite models.md and rewards.png from the recorded models.json in --out")
    args = p.parse_args(argv)
    if args.replot:
        doc = json.loads((args.out / "models.json").read_text())
        plot(doc, args.out / "rewards.png")
        (args.out / "models.md").write_text(markdown(doc))
        print(markdown(doc))
        return
    fams = [FAMILIES[f] for f in args.families.split(",")]
    from bench.harness.provenance import code_version

    commit, dirty = code_version()
    logs = args.out / "logs"
    log = Log(logs / "models.log")
    load_start, t0 = os.getloadavg(), time.monotonic()
    log(f"families {', '.join(f.name for f in fams)}; {args.iterations} iterations, lr {args.lr:g} and 0; "
        f"commit {commit}; load {load_start[0]:.2f}")
    rows = []
    for fam in fams:
        trained = run_arm(fam, args.lr, args.iterations, args.runs, logs, args.timeout, log)
        control = run_arm(fam, 0.0, args.iterations, args.runs, logs, args.timeout, log) if fam.learns else None
        rows.append({**family_row(fam, args.lr, trained, control), "commit": commit,
                     "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    if args.merge and (args.out / "models.json").is_file():
        rows = merge_rows(json.loads((args.out / "models.json").read_text()), rows)
    command = "python -m bench.models" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    doc = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit, "dirty": dirty,
           "machine": f"{os.cpu_count()} cores, shared", "iterations": args.iterations, "lr": args.lr,
           "common_sets": list(COMMON_SETS), "warm_moe_preset": "qwen3-moe" in PRESETS,
           "load_start": [round(x, 2) for x in load_start], "load_end": [round(x, 2) for x in os.getloadavg()],
           "wall_s": round(time.monotonic() - t0, 1), "families": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "models.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, args.out / "rewards.png")
    (args.out / "models.md").write_text(markdown(doc))
    log(f"wrote {args.out}/models.json, models.md, rewards.png in {doc['wall_s'] / 60:.1f} min")
    print(markdown(doc))


if __name__ == "__main__":
    main()
