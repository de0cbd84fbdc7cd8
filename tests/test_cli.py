"""`seer-run --sync`: bad input fails fast and names the problem; a real iteration writes its metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seer.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "override, key",
    [
        ("scheduler.chunk_size=0", "scheduler.chunk_size"),
        ("rollout.group_size=1", "rollout.group_size"),
        ("rollout.no_such_key=3", "rollout.no_such_key"),
        ("instances.count=4096", "instances.count"),
        ("scheduler.policy=fastest", "scheduler.policy"),
        ("rollout.temperature=hot", "rollout.temperature"),
    ],
)
def test_invalid_config_is_rejected_naming_the_key(override, key, tmp_path):
    r = run_cli("--sync", "--set", override, "--run-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert key in r.stdout
    assert not (tmp_path / "run").exists()  # rejected before anything started


def test_invalid_yaml_file_is_rejected(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("scheduler: [not, a, mapping]\n")
    r = run_cli("--sync", "--config", str(cfg), timeout=120)
    assert r.returncode == 2
    assert "scheduler" in r.stdout


def test_malformed_dataset_line_names_file_and_line(tmp_path, tiny_model):
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"prompt": "sum 1 2 =", "answer": 3}\n{"prompt": "sum 3 4 =", "answer": 7\n')
    r = run_cli(
        "--sync", "--train", "off", "--set", f"task.dataset={data}", "--set", "task.reward=seer.tasks.running_sum:score",
        "--set", "model.preset=tiny", "--run-dir", str(tmp_path / "run"), timeout=300,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{data}:2" in r.stdout.replace("\n", "")
    assert not (tmp_path / "run" / "logs").exists()  # no instance was started


@pytest.mark.vllm
def test_rollout_only_iteration_writes_metrics(vllm_pool, tmp_path):
    """The main command on running instances (connect mode), rollout and reward only."""
    urls = "[" + ",".join(c.base_url for c in vllm_pool.clients) + "]"
    run_dir = tmp_path / "run"
    r = run_cli(
        "--sync", "--train", "off", "--iterations", "1", "--run-dir", str(run_dir),
        "--set", "model.preset=tiny", "--set", f"instances.urls={urls}",
        "--set", "rollout.groups_per_iteration=4", "--set", "rollout.group_size=4",
        "--set", "rollout.max_tokens=512", "--set", "scheduler.policy=group_rr",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["num_samples"] == 16 and rec["policy"] == "group_rr"
    assert rec["output_tokens"] > 0 and rec["tokens_per_s"] > 0
    assert 0 <= rec["tail_s"] <= rec["wall_s"]
    assert {i["name"] for i in rec["instances"]} == set(vllm_pool.names)
    for inst in rec["instances"]:
        assert inst["busy_s"] > 0 and inst["busy_s"] + inst["idle_s"] == pytest.approx(rec["wall_s"], rel=1e-3, abs=1e-3)
    assert rec["preemptions"] == sum(i["preemptions"] for i in rec["instances"])  # the instances' vLLM counters
    assert rec["reward_mean"] is not None
    samples = [json.loads(x) for x in (run_dir / "rollouts" / "iter_0000.jsonl").read_text().splitlines()]
    assert len(samples) == 16
    # group-level dispatch: every sample of a group ran on one instance
    by_group = {}
    for s in samples:
        by_group.setdefault(s["group_id"], set()).update(s["instances"])
    assert all(len(v) == 1 for v in by_group.values())
    assert (run_dir / "iterations.png").stat().st_size > 1000
    assert "iteration 0" in r.stdout and "Seer iterations" in r.stdout  # the iteration's table, then the run's


def test_a_run_directory_holding_a_run_is_refused_and_left_untouched(tmp_path):
    """Without --resume or --overwrite a new run never writes into an old run's directory."""
    from seer.rundir import RunDir

    d = tmp_path / "run"
    RunDir(d).commit_checkpoint(4, 5, keep=2)
    (d / "metrics.jsonl").write_text('{"iteration": 4}\n')
    before = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    r = run_cli("--sync", "--run-dir", str(d), "--set", "model.preset=tiny", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "already holds a run" in r.stdout and "--overwrite" in r.stdout
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == before
    r = run_cli("--sync", "--resume", "--overwrite", "--run-dir", str(d), timeout=120)
    assert r.returncode == 2 and "exclude each other" in r.stdout


def test_a_checkpoint_the_trainer_cannot_train_is_refused_before_anything_starts(tmp_path, tiny_model):
    """An unsupported family is named, with what is supported, before Ray, instances or the pool."""
    ckpt = tmp_path / "gemma"
    ckpt.mkdir()
    for f in tiny_model.iterdir():
        (ckpt / f.name).symlink_to(f)
    config = json.loads((tiny_model / "config.json").read_text())
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").write_text(json.dumps({**config, "model_type": "gemma2"}))
    r = run_cli("--sync", "--set", f"model.path={ckpt}", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "model_type 'gemma2'" in out and "qwen2, qwen3, qwen3_moe, llama" in out, out
    assert not (tmp_path / "run" / "logs").exists()  # no instance, trainer rank or Ray was started
    assert "Ray" not in out and "instance" not in out.replace("--train off", "")


@pytest.mark.parametrize("change, named", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "rope_type 'yarn'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"model_type": "llama", "mlp_bias": True}, "mlp_bias"),
    ({"num_attention_heads": None}, "lacks 'num_attention_heads'"),
])
def test_the_refusal_names_the_unsupported_key(change, named, tmp_path, tiny_model):
    from seer.config import ConfigError
    from seer.job import _check_trainable

    config = {**json.loads((tiny_model / "config.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    with pytest.raises(ConfigError, match=named):
        _check_trainable(tmp_path)
    (tmp_path / "config.json").write_text((tiny_model / "config.json").read_text())
    _check_trainable(tmp_path)  # the embedded model itself is trainable


def test_a_rollout_function_that_does_not_resolve_is_rejected_naming_the_key(tmp_path):
    r = run_cli("--sync", "--set", "rollout.function=seer.no_such_module:rollout",
                "--run-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "rollout.function" in r.stdout
    assert not (tmp_path / "run").exists()


def test_two_runs_without_a_run_dir_get_two_directories(vllm_pool, tmp_path):
    """`make run` twice in a row: each run gets runs/<date>-<time>, runs/latest is the second."""
    urls = "[" + ",".join(c.base_url for c in vllm_pool.clients) + "]"
    args = [sys.executable, "-m", "seer.cli", "--sync", "--train", "off", "--iterations", "1",
            "--set", "model.preset=tiny", "--set", f"instances.urls={urls}", "--set", "task.num_prompts=2",
            "--set", "rollout.groups_per_iteration=2", "--set", "rollout.group_size=2",
            "--set", "rollout.max_tokens=16"]
    for _ in range(2):
        r = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = sorted(p for p in (tmp_path / "runs").iterdir() if p.name != "latest")
    assert len(runs) == 2
    assert (tmp_path / "runs" / "latest").resolve() == runs[1].resolve()
    for d in runs:
        assert len((d / "metrics.jsonl").read_text().splitlines()) == 1
        assert "iteration 0:" in (d / "run.log").read_text()
