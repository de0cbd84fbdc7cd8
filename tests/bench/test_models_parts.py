"""bench.models' pieces that need no run: metrics records -> per-run summary -> the family's row and table."""

import json
import math

from bench.models import FAMILIES, Family, family_row, markdown, merge_rows, summarize


def record(it: int, reward: float, mm: float | None, mx: float | None, train_s: float | None = 2.0) -> dict:
    return {"iteration": it, "reward_mean": reward, "logprob_mismatch_mean": mm, "logprob_mismatch_max": mx,
            "train_s": train_s, "wall_s": 10.0 + it, "num_samples": 128, "output_tokens": 1000 + it}


def arm(records: list[dict], lr: float, rc: int = 0) -> dict:
    s = summarize(records)
    from dataclasses import asdict
    return {"lr": lr, "sets": ["model.preset=qwen3", f"trainer.lr={lr:g}"], "command": "seer-run", "rc": rc,
            "error": "" if rc == 0 else "boom", "wall_s": 100.0, "summary": asdict(s) if records else None}


def test_summary_orders_iterations_and_keeps_missing_mismatch_as_none():
    s = summarize([record(1, 0.5, float("nan"), float("nan"), None), record(0, 0.25, 3e-7, 5e-5)])
    assert s.iterations == [0, 1] and s.reward == [0.25, 0.5]
    assert s.mismatch_mean == [3e-7, None] and s.mismatch_max == [5e-5, None]
    assert s.train_s == [2.0, 0.0] and s.rollout_s == [10.0, 11.0]


def test_family_row_takes_iteration_zero_the_extremes_and_both_arms_gains():
    trained = arm([record(0, 0.2, 3e-7, 5e-5, 4.0), record(1, 0.3, 1e-7, 9e-5, 6.0), record(2, 0.5, 2e-7, 1e-5, 5.0)], 2e-4)
    control = arm([record(0, 0.25, 3e-7, 5e-5), record(1, 0.2, 3e-7, 5e-5), record(2, 0.3, 3e-7, 5e-5)], 0.0)
    r = family_row(FAMILIES["qwen3"], 2e-4, trained, control)
    assert (r["mismatch_mean_iter0"], r["mismatch_max_iter0"]) == (3e-7, 5e-5)
    assert math.isclose(r["mismatch_mean_all"], 2e-7) and r["mismatch_max_all"] == 9e-5
    assert r["train_s_mean"] == 5.0
    assert math.isclose(r["reward_gain_trained"], 0.3) and math.isclose(r["reward_gain_control"], 0.05)
    assert math.isclose(r["reward_last_trained_minus_control"], 0.2)
    json.dumps(r, allow_nan=False)  # what models.json holds: no NaN


def test_markdown_shows_the_numbers_and_says_which_runs_failed_or_did_not_run():
    ok = family_row(FAMILIES["qwen2"], 2e-4, arm([record(0, 0.2, 3.5e-7, 5.46e-5), record(1, 0.4, 1e-7, 1e-5)], 2e-4),
                    arm([record(0, 0.2, 3e-7, 5e-5), record(1, 0.2, 3e-7, 5e-5)], 0.0))
    moe = family_row(Family("qwen3-moe", "tiny-qwen3-moe", learns=False), 2e-4, arm([], 2e-4, rc=1), None)
    doc = {"command": "python -m bench.models", "commit": "abc1234", "dirty": False, "date": "today", "wall_s": 600.0,
           "load_start": [1.0, 2.0, 3.0], "load_end": [1.5, 2.5, 3.5], "machine": "2 cores", "iterations": 2,
           "lr": 2e-4, "common_sets": ["rollout.group_size=8"], "families": [ok, moe]}
    md = markdown(doc)
    assert "| qwen2 | `default` | 3.50e-07 / 5.46e-05 | 2.25e-07 / 5.46e-05 | 2.0 | +0.200 / +0.000 | +0.200 | 100 / 100 |" in md
    assert "| qwen2 | 0.200 → 0.400 | 0.200 → 0.200 |" in md
    assert "| qwen3-moe | failed (rc 1) | not run (untrained model) |" in md
    assert "the trained run failed (rc 1): `boom`" in md and "1.00 / 2.00 / 3.00" in md


def test_merge_replaces_the_rerun_families_keeps_the_others_and_the_table_says_which_commit_each_came_from():
    row = lambda fam, reward: family_row(FAMILIES[fam], 2e-4, arm([record(0, reward, 3e-7, 5e-5)], 2e-4),
                                         arm([record(0, reward, 3e-7, 5e-5)], 0.0))
    old = {"commit": "old1234", "date": "yesterday", "families": [row("qwen2", 0.2), row("llama3", 0.0)]}
    new = [{**row("llama3", 0.3), "commit": "new5678", "date": "today"},
           {**row("qwen3-moe", 0.25), "commit": "new5678", "date": "today"}]
    rows = merge_rows(old, new)
    assert [(r["family"], r["commit"]) for r in rows] == [("qwen2", "old1234"), ("llama3", "new5678"),
                                                          ("qwen3-moe", "new5678")]
    assert rows[1]["trained"]["summary"]["reward"] == [0.3]
    doc = {"command": "python -m bench.models --families llama3,qwen3-moe --merge", "commit": "new5678", "dirty": False,
           "date": "today", "wall_s": 600.0, "load_start": [1.0, 2.0, 3.0], "load_end": [1.5, 2.5, 3.5],
           "machine": "2 cores", "iterations": 1, "lr": 2e-4, "common_sets": [], "families": rows}
    assert "Rows measured at different commits: qwen2 at old1234 (yesterday); llama3, qwen3-moe at new5678 (today)." in markdown(doc)
