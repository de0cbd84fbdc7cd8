"""Per-iteration metrics: one JSONL line per iteration, a summary table, and PNG plots.

Results people compare must be easy to compare: the JSONL is the machine-readable record,
the table is what the terminal shows, the plots are what the README shows.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from seer.rundir import atomic_write_text
from seer.types import SYSTEM_FAILURE, RolloutBatch


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    idx = min(len(v) - 1, max(0, int(round(q / 100.0 * (len(v) - 1)))))
    return float(v[idx])


def iteration_record(batch: RolloutBatch, extra: dict | None = None) -> dict:
    """Flat metrics of one iteration (the JSONL line), plus nested per-instance and timeline data.

    Every field is documented in docs/watching.md ("Fields of metrics.jsonl"). A sample is one row of
    the batch (one trained sequence); a session is what a group counts once: an agent session with all
    the leaves its branches left, else the sample itself. Per-sample numbers say `samples` or nothing
    (the older names), per-session ones say `sessions`."""
    st = batch.stats
    rewards = [s.reward for s in batch.samples if s.reward is not None]
    lengths = [s.num_tokens for s in batch.samples]
    sessions: dict[str, float | None] = {}  # a session's reward: its leaves all carry it
    for s in batch.samples:
        sessions.setdefault(s.session, s.reward)
    session_rewards = [r for r in sessions.values() if r is not None]
    system = [s for s in batch.samples if s.failure == SYSTEM_FAILURE]
    rec = {
        "iteration": st.iteration,
        "policy": st.policy,
        "num_samples": len(batch.samples),
        "num_sessions": len(sessions),
        "num_trained_samples": sum(1 for g in batch.train_groups() for s in g if s.response_ids),
        "num_generated": st.num_samples,  # requests the rollout finished: every round's, a session once
        "wall_s": round(st.wall_s, 3),
        "output_tokens": st.output_tokens,
        "tokens_per_s": round(st.tokens_per_s, 2),
        "tail_s": round(st.tail_s, 3),
        "preemptions": st.preemptions,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_mean_sessions": statistics.fmean(session_rewards) if session_rewards else None,
        "reward_std_sessions": statistics.pstdev(session_rewards) if len(session_rewards) > 1 else 0.0,
        "reward_errors": sum(1 for s in batch.samples if s.reward_error is not None),
        "system_failed_samples": len(system),
        "system_failed_sessions": len({s.session for s in system}),
        "len_p50": percentile(lengths, 50),
        "len_p99": percentile(lengths, 99),
        "len_max": max(lengths) if lengths else 0,
        "truncated": sum(1 for s in batch.samples if s.finish_reason == "length"),
        "weight_versions": sorted({s.weight_version for s in batch.samples}),
        "instances": [asdict(i) | {"idle_fraction": round(i.idle_fraction, 4)} for i in st.instances],
        "instances_dropped": [{"instance": d.instance, "reason": d.reason, "t": d.at_s} for d in batch.dropped],
    }
    rec.update({k: v for k, v in st.extra.items()})
    rec.update(extra or {})
    return rec


class MetricsLog:
    """Appends iteration records to `<run_dir>/metrics.jsonl`; reads them back for --resume and plots."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        text = self.path.read_text()
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            try:
                json.loads(lines[-1])
            except json.JSONDecodeError:  # a kill mid-append: that iteration was never committed
                lines.pop()
        return [json.loads(line) for line in lines if line.strip()]

    def truncate_after(self, iteration: int) -> None:
        """Drop lines of iterations > `iteration` (a resumed run redoes them)."""
        keep = [r for r in self.records() if r["iteration"] <= iteration]
        atomic_write_text(self.path, "".join(json.dumps(r, default=float) + "\n" for r in keep))


SUMMARY_COLUMNS = [
    ("iter", "iteration", "{}"),
    ("policy", "policy", "{}"),
    ("reward", "reward_mean", "{:.3f}"),
    ("±", "reward_std", "{:.3f}"),
    ("len p50", "len_p50", "{:.0f}"),
    ("len p99", "len_p99", "{:.0f}"),
    ("rollout s", "wall_s", "{:.1f}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
    ("tail s", "tail_s", "{:.1f}"),
    ("train s", "train_s", "{:.1f}"),
    ("sync s", "weight_sync_s", "{:.1f}"),
    ("accept len", "acceptance_length", "{:.2f}"),
]

SUMMARY_KEYS = [key for _, key, _ in SUMMARY_COLUMNS]


def _fmt(fmt: str, value) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def summary_table(records: list[dict], title: str = "Seer iterations") -> Table:
    cols = [c for c in SUMMARY_COLUMNS if any(r.get(c[1]) is not None for r in records)]
    table = Table(title=title)
    for head, _, _ in cols:
        table.add_column(head, justify="right")
    for r in records:
        table.add_row(*(_fmt(fmt, r.get(key)) for _, key, fmt in cols))
    return table


def plot_iterations(records: list[dict], out: Path) -> Path:
    """Reward and rollout throughput per iteration, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in records]
    means = [r.get("reward_mean") or 0 for r in records]
    # The band is the standard error of the mean, not the per-sample spread: the question a
    # reward curve answers is whether the mean moved.
    sems = [(r.get("reward_std") or 0) / max(1, r.get("num_samples") or 1) ** 0.5 for r in records]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(its, means, marker="o")
    a.fill_between(its, [m - e for m, e in zip(means, sems)], [m + e for m, e in zip(means, sems)], alpha=0.2)
    a.xaxis.get_major_locator().set_params(integer=True)
    b.xaxis.get_major_locator().set_params(integer=True)
    a.set_xlabel("iteration")
    a.set_ylabel("mean reward (± standard error)")
    a.set_title("Reward")
    b.bar(its, [r.get("tokens_per_s") or 0 for r in records])
    b.set_xlabel("iteration")
    b.set_ylabel("output tokens/s")
    b.set_title("Rollout throughput")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
