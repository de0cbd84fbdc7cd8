"""Watching a real run as RL users do: `seer-run` with stdout in a log file (not a terminal), on the
session's vLLM instances, writing TensorBoard, W&B (offline) and MLflow (local file store), the
iteration's chunk timeline and a live /metrics endpoint; then `--resume` for a second iteration.

Everything is read back with the tools' own readers: tensorboard's event accumulator and a real
`tensorboard --logdir` server over HTTP, `wandb leet inspect`, MLflow's client; the trace with the
project's checker of the trace event format, slice by slice against the run's own rollouts file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from seer.procs import free_port
from seer.watch.trace import check_trace, chunk_slices
from seer.watch.tracking import scalars

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

BIN = Path(sys.executable).parent


def _cmd(run_dir: Path, urls: list[str], iterations: int, *extra: str) -> list[str]:
    sets = {
        "instances.urls": "[" + ",".join(urls) + "]", "model.preset": "tiny", "task.num_prompts": 8,
        "rollout.groups_per_iteration": 4, "rollout.group_size": 8, "rollout.max_tokens": 384,
        "scheduler.chunk_size": 64, "logging.backends": "[tensorboard,wandb,mlflow]",
        "logging.metrics_port": 0, "logging.metrics_linger_s": 1, "logging.progress_interval_s": 1,
    }
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--train", "off", "--iterations", str(iterations),
           "--run-dir", str(run_dir), *extra]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _watch_metrics(proc: subprocess.Popen, log: Path, seen: list[dict]) -> None:
    """Scrape the run's /metrics (its URL is on stdout) every 50 ms until the run exits."""
    url = None
    while proc.poll() is None:
        if url is None:
            m = re.search(r"live metrics: (http://127\.0\.0\.1:\d+/metrics)", log.read_text())
            url = m.group(1) if m else None
        else:
            try:
                seen.append(_scrape(url))
            except OSError:
                pass
        time.sleep(0.05)


@pytest.fixture(scope="module")
def watched_run(vllm_pool, tmp_path_factory):
    """Run 1 (1 iteration, the model built into an empty cache) and run 2 (--resume to 2)."""
    tmp = tmp_path_factory.mktemp("watch")
    urls = [c.base_url for c in vllm_pool.clients]
    run_dir = tmp / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "SEER_CACHE_DIR": str(tmp / "cache")}
    logs, scraped = [], []
    for i, extra in enumerate([(), ("--resume",)]):
        log = tmp / f"run{i}.log"
        seen: list[dict] = []
        with open(log, "w") as out:
            proc = subprocess.Popen(_cmd(run_dir, urls, i + 1, *extra), stdout=out, stderr=subprocess.STDOUT, env=env)
            watcher = threading.Thread(target=_watch_metrics, args=(proc, log, seen))
            watcher.start()
            rc = proc.wait(timeout=600)
            watcher.join()
        assert rc == 0, log.read_text()[-4000:]
        logs.append(log.read_text())
        scraped.append(seen)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"dir": run_dir, "logs": logs, "scraped": scraped, "records": records}


def test_the_run_directory_holds_only_what_seer_lists_as_its_own(watched_run):
    """--overwrite removes exactly seer.rundir.SEER_ENTRIES: a run with every tracking backend (and a
    resume) writes nothing else, so the list is complete and --overwrite can replace this run."""
    from seer.rundir import MARKER, foreign_entries

    assert foreign_entries(watched_run["dir"]) == []
    assert {MARKER, "tensorboard", "wandb", "mlruns", "tracking.json"} <= {p.name for p in watched_run["dir"].iterdir()}


def test_a_log_file_gets_progress_lines_for_the_build_and_the_rollout(watched_run):
    first = watched_run["logs"][0]
    assert "\x1b[" not in first and "⠋" not in first  # no escape codes, no spinner
    build = "Preparing the model (first use builds and warm-starts the embedded default)"
    ticks = re.findall(re.escape(build) + r": (\d+) s\n", first)
    assert len(ticks) >= 2 and int(ticks[-1]) >= 2, first[:3000]  # the tiny model's build takes seconds
    assert re.search(re.escape(build) + r": done in [\d.]+ s", first)
    assert "rollout 0 ...\n" in first
    done = re.search(r"rollout 0: done in [\d.]+ s, 32/32 samples, \d+ tok, \d+ tok/s", first)
    assert done, first[-3000:]
    assert "rollout 1: done in" in watched_run["logs"][1]


def test_every_field_of_a_real_runs_metrics_jsonl_is_documented(watched_run):
    from tests.test_metrics_fields import undocumented

    for record in watched_run["records"]:
        assert undocumented(record) == [], "not in docs/watching.md, Fields of metrics.jsonl"
        assert record["num_samples"] == record["num_sessions"] == record["num_generated"] == 32


def test_tensorboard_events_hold_every_number_of_metrics_jsonl_at_its_iteration(watched_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = watched_run["records"]
    assert [r["iteration"] for r in records] == [0, 1]
    acc = EventAccumulator(str(watched_run["dir"] / "tensorboard"),
                           size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    expected = scalars(records[0])
    assert {"tokens_per_s", "wall_s", "reward_mean", "chunks_dispatched", "tail_s"} <= set(expected)
    assert set(expected) <= set(tags["scalars"])
    for key in ("tokens_per_s", "reward_mean", "chunks_dispatched", "output_tokens"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [0, 1]  # the resumed run continued at step 1
        assert [e.value for e in events] == pytest.approx([r[key] for r in records], rel=1e-6)
    inst = records[0]["instances"][0]["name"]
    assert f"instances/{inst}/busy_s" in tags["scalars"]
    assert {"response_length", "reward", f"kv_usage/{inst}"} <= set(tags["histograms"])
    lengths = acc.Histograms("response_length")
    assert [h.step for h in lengths] == [0, 1] and lengths[0].histogram_value.num == 32
    text = acc.Tensors("samples")
    assert [t.step for t in text] == [0, 1] and b"reward" in text[0].tensor_proto.string_val[0]


def test_a_tensorboard_server_serves_the_scalars_over_http(watched_run):
    port = free_port()
    server = subprocess.Popen([str(BIN / "tensorboard"), "--logdir", str(watched_run["dir"] / "tensorboard"),
                               "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false",
                               "--reload_interval", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=.&tag=tokens_per_s"
        deadline, points = time.monotonic() + 120, None
        while time.monotonic() < deadline and not points:
            assert server.poll() is None, "tensorboard exited"
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    points = json.loads(r.read())
            except OSError:
                time.sleep(0.5)
        assert points, "tensorboard served no tokens_per_s within 120 s"
        assert [p[1] for p in points] == [0, 1]
        assert [p[2] for p in points] == pytest.approx([r["tokens_per_s"] for r in watched_run["records"]], rel=1e-6)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_mlflow_and_wandb_offline_hold_the_runs_metrics(watched_run):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    run_dir, records = watched_run["dir"], watched_run["records"]
    ids = json.loads((run_dir / "tracking.json").read_text())
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    history = client.get_metric_history(ids["mlflow_run_id"], "tokens_per_s")
    assert sorted((m.step, m.value) for m in history) == [(r["iteration"], pytest.approx(r["tokens_per_s"])) for r in records]
    run = client.get_run(ids["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["rollout.group_size"] == "8"

    steps = {}
    for d in sorted((run_dir / "wandb").glob(f"offline-run-*-{ids['wandb_run_id']}")):
        out = subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--json", str(d)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        for line in out.stdout.splitlines():
            rec = json.loads(line)
            if rec.get("type") == "history":
                item = rec["history"]["item"]
                steps[item["_step"]] = item
    assert sorted(steps) == [0, 1]  # the resumed run logged into the same W&B run id at step 1
    for r in records:
        assert steps[r["iteration"]]["tokens_per_s"] == pytest.approx(r["tokens_per_s"])
        assert steps[r["iteration"]]["chunks_dispatched"] == r["chunks_dispatched"]


def test_the_trace_passes_the_checker_and_has_one_slice_per_chunk(watched_run):
    run_dir, rec = watched_run["dir"], watched_run["records"][0]
    trace = json.loads((run_dir / "rollouts" / "iter_0000.trace.json").read_text())
    assert check_trace(trace) == []
    slices = chunk_slices(trace)
    assert len(slices) == rec["chunks_dispatched"] > 32  # 64-token chunks: requests took several
    assert sum(s["migrated"] for s in slices) == rec["chunks_migrated"]
    assert sum(s["prefix_cached"] for s in slices) == rec["prefix_tokens_cached"]
    assert sum(s["prefix_recomputed"] for s in slices) == rec["prefix_tokens_recomputed"]
    samples = [json.loads(x) for x in (run_dir / "rollouts" / "iter_0000.jsonl").read_text().splitlines()]
    for s in samples:  # each request's slices, in chunk order, are where its chunks ran
        mine = sorted((x for x in slices if x["request"] == s["request_id"]), key=lambda x: x["chunk"])
        assert [x["instance"] for x in mine] == s["instances"]
        assert sum(x["tokens"] for x in mine) == s["num_tokens"]
        assert [x["chunk"] for x in mine] == list(range(len(mine))) and mine[-1]["last"]
    phases = {ev["name"] for ev in trace["traceEvents"] if ev.get("cat") == "phase"}
    assert {"rollout", "generate", "reward tail"} <= phases
    counters = {(ev["pid"], ev["name"]) for ev in trace["traceEvents"] if ev["ph"] == "C"}
    assert len({pid for pid, name in counters if name == "kv_usage"}) == 2


def test_metrics_endpoint_answers_during_the_rollout_with_changing_values(watched_run):
    seen = watched_run["scraped"][0]
    during = [m for m in seen if m.get('seer_phase{phase="rollout"}') == 1.0]
    tokens = [m["seer_rollout_output_tokens"] for m in during]
    assert len(set(tokens)) >= 3, tokens  # scraped mid-rollout at least thrice with new values
    assert tokens == sorted(tokens)
    assert any(m["seer_chunks_in_flight"] > 0 for m in during)
    names = [i["name"] for i in watched_run["records"][0]["instances"]]
    assert {k for m in during for k in m if k.startswith("seer_instance_kv_usage")} == {
        f'seer_instance_kv_usage{{instance="{n}"}}' for n in names}
    last = seen[-1]
    assert last["seer_rollout_finished_requests"] == 32 and last["seer_iteration"] == 0
    assert last["seer_last_reward_mean"] == pytest.approx(watched_run["records"][0]["reward_mean"]), ([{k: v for k, v in m.items() if "phase" in k or "iteration" in k or "reward" in k or "version" in k} for m in seen[-4:]], len(seen), watched_run["logs"][0][-1500:])
    assert watched_run["scraped"][1][-1]["seer_iteration"] == 1
