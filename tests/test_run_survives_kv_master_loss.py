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
"in X s"). With SEER_RECORD=1 the measured values go to bench/results/failures/run_kv_master_loss.json."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from failure_record import bound, record
from seer.kvpool.accounting import MasterStats
from tests.sockets import guards, server_groups
from seer.procs.prometheus import parse_prometheus

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

RESTART = bound("run_kv_master_loss", "master_restarted_in")
MOVE = "seer.scheduler.policies.moving:MoveEveryChunk"


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


def test_run_restarts_a_killed_kv_master_and_the_instances_use_it_again(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    sets = {"model.preset": "tiny", "task.num_prompts": 8, "rollout.groups_per_iteration": 4,
            "rollout.group_size": 4, "rollout.max_tokens": 256, "scheduler.chunk_size": 64,
            "kvpool.capacity_bytes": 16 * 2**20, "trainer.lr": 1e-4,
            # every continuation chunk changes instance: iteration 1 surely migrates, and loads the
            # migrated prefixes from the restarted master
            "scheduler.policy": MOVE}
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "3", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    log = tmp_path / "run.log"
    after_restart: list[dict[str, float]] = []
    with open(log, "w") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
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
    text = log.read_text()
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
           "seer-run --sync with the KV pool, 2 instances, MoveEveryChunk; mooncake_master SIGKILLed once "
           "iteration 0 is rolled out; 3 iterations")
