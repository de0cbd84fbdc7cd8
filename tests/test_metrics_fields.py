"""Every key an iteration's record (metrics.jsonl) can carry is documented in docs/watching.md,
"Fields of metrics.jsonl". Records of real rollouts are checked where they are made (the gateway's
in tests/gateway/test_system_failures.py, the environment's in tests/multiturn/test_env_contract.py,
a real seer-run's in tests/test_watch.py); here the trainer's and the loop's keys."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def documented_fields() -> tuple[set[str], tuple[str, ...]]:
    """(the table's field names, the prefixes its `name_*` rows cover)."""
    text = (ROOT / "docs/watching.md").read_text()
    section = text[text.index("## Fields of metrics.jsonl"):]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z0-9_*]+)`", line.split("|")[1]))
    return {n for n in names if not n.endswith("*")}, tuple(n[:-1] for n in names if n.endswith("*"))


def undocumented(record: dict) -> list[str]:
    names, prefixes = documented_fields()
    return sorted(k for k in record if k not in names and not k.startswith(prefixes))


def test_the_fields_table_is_there_and_names_the_per_session_and_per_sample_counts():
    names, prefixes = documented_fields()
    assert {"num_samples", "num_sessions", "num_trained_samples", "reward_mean", "reward_mean_sessions",
            "system_failed_sessions", "gateway_totals"} <= names
    assert "gateway_counters" not in names and prefixes == ("moe_",)


def test_the_trainers_keys_are_documented():
    from seer.trainer.metrics import TrainMetrics

    tm = TrainMetrics(1, 0.1, 0.1, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 10, 2, 0.0, 1.0,
                      extra={"rollout_is_weight_mean": 1.0, "moe_load_max": 1.0, "tree_token_ratio": 1.0})
    assert undocumented(tm.record()) == []


def test_the_loops_own_keys_are_documented():
    """The keys seer.loop adds to a record (`extra[...] =`, `extra = {...}`, `extra.update(k=...)`)."""
    tree = ast.parse((ROOT / "seer/loop.py").read_text())
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "extra" \
                and isinstance(node.value, ast.Dict):
            keys.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "extra" \
                and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "extra":
            keys.update(k.arg for k in node.keywords if k.arg)
    assert {"reward_error_total", "weight_sync_s", "train_skipped", "train_ranks", "instance_nodes"} <= keys
    assert undocumented(dict.fromkeys(keys)) == []


def test_a_record_counts_sessions_and_samples_apart_each_under_its_own_name():
    """Issue 36: with branches, `num_samples` counted sessions while `reward_mean` averaged rows."""
    from seer.metrics_log import iteration_record
    from seer.types import Branch, IterationStats, PromptSpec, RolloutBatch, Sample

    def row(session: str, i: int, reward: float | None, failure: str | None = None) -> Sample:
        return Sample(0, i, f"{session}-{i}", PromptSpec(0, "", [1], {}), [2, 3], [0.0, 0.0], "stop", 0.0, 0.0, ["e0"],
                      reward=reward, failure=failure, branch=Branch(session, (i,)))

    # session a left two leaves (reward 1), b one (reward 0), c failed for the system's reasons
    rows = [row("a", 0, 1.0), row("a", 1, 1.0), row("b", 2, 0.0), row("c", 3, None, "system")]
    stats = IterationStats(0, "context", 1.0, 8, 8.0, 0.0, num_samples=3, preemptions=0)
    rec = iteration_record(RolloutBatch(rows, stats))
    assert (rec["num_samples"], rec["num_sessions"], rec["num_generated"], rec["num_trained_samples"]) == (4, 3, 3, 3)
    assert rec["reward_mean"] == 2 / 3 and rec["reward_mean_sessions"] == 0.5
    assert rec["system_failed_samples"] == rec["system_failed_sessions"] == 1 and undocumented(rec) == []
