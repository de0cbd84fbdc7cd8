"""`seer-run --sync` with the Mooncake KV pool loses its master (SIGKILL) once iteration 0 is rolled
out: the next check (before the weight update, or before a rollout) finds the master gone, starts
it again on its own address and clears the (now empty) pool through it; the last iteration's
instances, never restarted, store to and load from the restarted master, and every iteration is
complete. Three iterations, so that a rollout follows the restart even when the kill lands after
iteration 1's rollout began (the window between the rollouts is under a second).

The schedule is forced: the MoveEveryChunk test policy runs every continuation chunk on the other
instance, so every iteration migrates chunks whatever the load (with a placement policy a loaded
machine could keep every chunk with its prefix, and the pool would serve nothing). docs/failures.md's
bound (tests/failure_record.py's RECORDS): the job restarts the master within RESTART (the log's
"in X s"). With SEER_RECORD=1 the measured values go to bench/results/failures/run_kv_master_loss.json.

The same run is the Qwen3 end-to-end test (issue 29): the model is the untrained tiny Qwen3 preset
(QK-norm, head_dim decoupled from hidden / heads), trained by the real Megatron trainer, its
weights pushed into the running vLLM instances in place each iteration, every rollout checked to
be served the new version, chunks moving between instances with their prefixes from the pool.
That vLLM and Megatron compute the same Qwen3 is the log-prob mismatch the trainer measures on
every trained token. The reward is the response's length, so the untrained model's groups differ
(it emits EOS at random) and every update moves the policy; trainer.lr is large so that it moves
it far beyond the mismatch bound (a stale or mis-mapped model would exceed it).
Sharing one run keeps the suite's budget: a vLLM start is most of either test's time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from failure_record import bound, record
from seer.kvpool.accounting import MasterStats
from tests.sockets import guards, server_groups
from seer.procs.prometheus import parse_prometheus

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

RESTART = bound("run_kv_master_loss", "master_restarted_in")
MOVE = "seer.scheduler.policies.moving:MoveEveryChunk"
REPO = Path(__file__).resolve().parents[1]
QWEN3, LENGTH_REWARD, LR = "tiny-qwen3", "tests.plugins_for_tests:reward_by_length", 1e-2
MISMATCH_MEAN, MISMATCH_MAX = 1e-5, 1e-3  # fp32 on both sides (measured ~2e-7 / ~1e-6)


def _master_guard(pid: int) -> tuple[int, str] | None:
    """(guard pid, metrics host:port) of the job's mooncake_master, or None."""
    for guard in guards(pid, "mooncake_master"):
        cmd = Path(f"/proc/{guard}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        host = re.search(r"--metrics_host=(\S+)", cmd).group(1)
        port = re.search(r"--metrics_port=(\d+)", cmd).group(1)
        return guard, f"{host}:{port}"
    return None


def _master_metrics(address: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    return {name: value for name, labels, value in parse_prometheus(text) if not labels}


@dataclass
class KVLossRun:
    run_dir: Path
    log: str
    after_restart: list[dict[str, float]]  # the restarted master's metrics, sampled until the job ended


@pytest.fixture(scope="module")
def kv_loss_run(tmp_path_factory) -> KVLossRun:
    """The one run both tests read (the model and reward serve the Qwen3 test; the restart does not
    depend on them)."""
    tmp_path = tmp_path_factory.mktemp("kv-master-loss")
    run_dir = tmp_path / "run"
    sets = {"model.preset": QWEN3, "task.num_prompts": 8, "rollout.groups_per_iteration": 4,
            "rollout.group_size": 4, "rollout.max_tokens": 256, "scheduler.chunk_size": 64,
            "kvpool.capacity_bytes": 16 * 2**20, "trainer.lr": LR, "task.reward": LENGTH_REWARD,
            # every continuation chunk changes instance: iteration 1 surely migrates, and loads the
            # migrated prefixes from the restarted master
            "scheduler.policy": MOVE}
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "3", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    # the length reward lives in tests/: importable from the repository root
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    log = tmp_path / "run.log"
    after_restart: list[dict[str, float]] = []
    with open(log, "w") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        try:
            marker = run_dir / "rollouts" / "iter_0000.jsonl"  # iteration 0 rolled out: training starts
            deadline = time.monotonic() + 600
            while not (marker.exists() and marker.read_text().strip()):
                assert job.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.1)
            guard, metrics_port = _master_guard(job.pid)
            for master in server_groups(guard):  # mooncake_master leads its own process group
                os.killpg(master, signal.SIGKILL)
            while job.poll() is None:  # the restarted master answers on the same metrics port
                m = _master_metrics(metrics_port)
                if m:
                    after_restart.append(m)
                time.sleep(0.2)
            assert job.returncode == 0, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                job.kill()
    return KVLossRun(run_dir, log.read_text(), after_restart)


def test_run_restarts_a_killed_kv_master_and_the_instances_use_it_again(kv_loss_run):
    run_dir, text, after_restart = kv_loss_run.run_dir, kv_loss_run.log, kv_loss_run.after_restart
    restarted = [line for line in text.splitlines() if "the Mooncake master had exited" in line]
    # The master dies around iteration 0's training; the loop notices at its next check: before the
    # weight update, or before a rollout (the kill can land as iteration 1's rollout begins, which
    # then runs without the pool: every lookup a miss, slowly). Either way the last rollout has it.
    assert restarted and any(f"({when}): restarted" in restarted[0]
                             for when in ("before the weight update", "before the rollout")), text[-3000:]
    took = float(re.search(r"restarted on \S+ in ([\d.]+) s", restarted[0]).group(1))
    RESTART.check(took, what=restarted[0])
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1, 2]
    assert all(r["num_samples"] == 16 for r in recs)  # no sample lost
    assert [r["weight_version"] for r in recs] == [0, 1, 2]
    assert len(recs[-1]["instances"]) == 2  # no instance was dropped or restarted
    assert all(r["policy"] == "move_every_chunk" for r in recs), [r["policy"] for r in recs]
    assert after_restart, "the restarted master never answered"
    last = after_restart[-1]
    stats = MasterStats.from_metrics("\n".join(f"{k} {v}" for k, v in last.items()))
    assert stats.capacity_bytes == 16 * 2**20  # the store re-mounted its segment
    # the last iteration's instances stored KV in, and loaded KV from, the restarted master
    assert last.get("master_batch_put_start_items_total", 0) > 0, last
    assert last.get("master_batch_get_replica_list_items_total", 0) > 0, last
    it1 = recs[-1]  # the last iteration: after the restart
    assert it1["chunks_migrated"] > 0, it1  # forced by the policy: every continuation moved
    assert it1["migrated_prefix_tokens_cached"] > 0, {k: it1.get(k) for k in (
        "chunks_dispatched", "chunks_migrated", "migrated_prefix_tokens", "migrated_prefix_tokens_cached")}
    record("run_kv_master_loss",
           {"master_restarted_in_s": took, "when": restarted[0].split("(")[1].split(")")[0],
            "last_iteration_chunks_migrated": it1["chunks_migrated"],
            "last_iteration_migrated_prefix_tokens": it1["migrated_prefix_tokens"],
            "last_iteration_migrated_prefix_tokens_cached": it1["migrated_prefix_tokens_cached"]},
           "seer-run --sync with the KV pool, 2 instances, MoveEveryChunk, the untrained tiny-qwen3 preset; "
           "mooncake_master SIGKILLed once "
           "iteration 0 is rolled out; 3 iterations")


def test_qwen3_trains_end_to_end_with_weights_pushed_in_place_and_chunks_moving(kv_loss_run):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from seer.model import ensure_model

    run_dir = kv_loss_run.run_dir
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_versions"] for r in recs] == [[0], [1], [2]]  # every rollout served the pushed version
    assert all(r["weight_sync_s"] > 0 for r in recs)  # pushed in place after every update
    assert recs[0]["reward_std"] > 0 and recs[0]["grad_norm"] > 0  # the update is not zero
    for r in recs:  # vLLM's Qwen3 (on moved chunks with pooled prefixes too) is Megatron's
        assert r["logprob_mismatch_mean"] < MISMATCH_MEAN and r["logprob_mismatch_max"] < MISMATCH_MAX, r
        assert r["chunks_migrated"] > 0, r
    # the updates moved the policy far beyond the bound: stale weights in vLLM would have shown
    base = ensure_model(QWEN3, progress=False)
    (pushed,) = sorted((run_dir / "weights").iterdir())
    assert AutoConfig.from_pretrained(pushed).model_type == "qwen3"
    ids = torch.randint(4, 260, (2, 64), generator=torch.Generator().manual_seed(0))
    logps = []
    for weights in (base, pushed):
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
        with torch.no_grad():
            logps.append(torch.log_softmax(model(ids).logits, -1))
    assert (logps[1] - logps[0]).abs().mean() > 100 * MISMATCH_MEAN
