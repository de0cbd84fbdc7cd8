"""`seer-run --sync` on a real two-node Ray cluster (two loopback addresses, a core each): one vLLM
instance and one KV store per node, chunks that move between nodes load their prefix from the
pool, a node lost mid-rollout costs no sample and leaves no process behind, the draft server
serves both nodes, and the trainer's ranks span both.

Three runs in all, as a run's start-up is most of its cost: the two-rank run and the node-loss run
are module fixtures that several tests read, each test asserting its own part. The DGDS run also
stands for a one-node run with DGDS (the same settings; the draft server on the driver's node)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from failure_record import bound, record
from seer.rundir import foreign_entries
from tests.sockets import guards, process_tree

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

MOVE = "seer.scheduler.policies.moving:MoveEveryChunk"
NODE_DROP = bound("run_node_loss", "dropped_after_loss")  # as for one lost instance (docs/failures.md)
ORPHANS_GONE = bound("run_node_loss", "processes_gone_after_loss")  # the guard's sentinel: SIGTERM, SIGKILL


def _job(cluster, run_dir: Path, log: Path, iterations: int = 2, **extra) -> subprocess.Popen:
    sets = {"model.preset": "tiny", "task.num_prompts": 8, "rollout.groups_per_iteration": 4,
            "rollout.group_size": 4, "rollout.max_tokens": 256, "scheduler.chunk_size": 64,
            "kvpool.capacity_bytes": 16 * 2**20, "trainer.lr": 1e-4,
            "cluster.address": cluster.address, "cluster.node_ip": cluster.nodes[0].ip,
            "cluster.placement_strategy": "STRICT_SPREAD",
            # every continuation chunk changes instance, and so node: moves do not depend on timing
            "scheduler.policy": MOVE, **extra}
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", str(iterations), "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=cluster.env())


def _placed(text: str) -> dict[str, tuple[str, str, str, str]]:
    """instance -> (node ip, Ray node id, url host, cores) from the fleet's lines in run.log."""
    found = re.findall(r"(inst\d+) on node (\S+) \(Ray node (\w+)\): http://([\d.]+):\d+, cores (\S+)", text)
    return {name: (ip, node_id, host, cores) for name, ip, node_id, host, cores in found}


def _node_processes(cluster, node) -> list[int]:
    """Every process Seer started on `node`: the guards under its Ray workers, and their trees."""
    out = []
    for pid in node.session_pids():
        for guard in guards(pid):
            out += process_tree(guard)
    return sorted(set(out))


_SECRETS: dict[int, str] = {}


def _secret(guard: int) -> set[str]:
    """The instance secret the server a guard runs holds (read in its memory: tests.sockets.instance_secret;
    its /proc/<pid>/environ never shows it), once found; empty while it is not."""
    from tests.sockets import instance_secret

    if guard not in _SECRETS:
        try:
            found = instance_secret(guard)
        except (OSError, ValueError):  # exited, or not serving yet
            found = None
        if found is None:
            return set()
        _SECRETS[guard] = found
    return {_SECRETS[guard]}


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@dataclass
class Run:
    """A finished run of this module and what the test saw of it while it ran."""

    run_dir: Path
    records: list[dict]  # metrics.jsonl
    text: str  # run.log
    stores: dict[str, str] = field(default_factory=dict)  # store host -> node whose Ray worker started it
    secrets: set[str] = field(default_factory=set)  # the instance secret, read where the servers hold it


@dataclass
class NodeLoss:
    """The one-rank run that lost node 127.0.0.4 once iteration 1's chunks ran on its instance."""

    run: Run
    lost_at: float  # this machine's monotonic clock, as the driver's
    gone_s: float  # from the loss until no process of Seer's on the node was left (or the grace ran out)
    left: list[int]  # those still alive then


def _finished(job: subprocess.Popen, log: Path, run_dir: Path, timeout_s: float) -> Run:
    assert job.wait(timeout=timeout_s) == 0, log.read_text()[-4000:]
    return Run(run_dir, _records(run_dir), (run_dir / "run.log").read_text())


@pytest.fixture(scope="module")
def two_rank_run(ray_two_nodes, tiny_model, tmp_path_factory) -> Run:
    """Three iterations at `trainer.data_parallel=2` (a rank on each node, gloo between them), every
    continuation chunk moved to the other node; its stores and secret are read from /proc meanwhile."""
    cluster = ray_two_nodes
    work = tmp_path_factory.mktemp("two-ranks")
    run_dir, log = work / "run", work / "run.log"
    stores: dict[str, str] = {}
    secrets: set[str] = set()
    job = _job(cluster, run_dir, log, iterations=3, **{"trainer.data_parallel": 2,
                                                       "trainer.placement_strategy": "STRICT_SPREAD"})
    deadline = time.monotonic() + 1000
    try:
        while job.poll() is None and time.monotonic() < deadline:
            for node in cluster.nodes:
                for guard in [g for pid in node.session_pids() for g in guards(pid, "mooncake_client")]:
                    try:
                        host = re.search(r"--host=([\d.]+)", Path(f"/proc/{guard}/cmdline").read_text())
                    except OSError:  # exited meanwhile
                        continue
                    if host:
                        stores[host.group(1)] = node.ip
                for guard in [g for pid in node.session_pids() for g in guards(pid, "vllm.entrypoints")]:
                    secrets.update(_secret(guard))
            time.sleep(0.5)
        assert job.poll() is not None, "the run did not finish within 1000 s"
        run = _finished(job, log, run_dir, timeout_s=1)
    finally:
        if job.poll() is None:
            job.kill()
    run.stores, run.secrets = stores, secrets
    return run


@pytest.fixture(scope="module")
def node_loss_run(ray_two_nodes, tiny_model, tmp_path_factory) -> NodeLoss:
    """Two iterations at one rank; every process of node 127.0.0.4's Ray session SIGKILLed once
    iteration 1's chunks run on its instance (the node is brought back afterwards)."""
    cluster = ray_two_nodes
    victim = cluster.nodes[1]
    work = tmp_path_factory.mktemp("node-loss")
    run_dir, log = work / "run", work / "run.log"
    job = _job(cluster, run_dir, log)
    try:
        marker = run_dir / "rollouts" / "iter_0000.jsonl"  # iteration 0 done: iteration 1 rolls out next
        deadline = time.monotonic() + 600
        while not (marker.exists() and marker.read_text().strip()):
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        [guard] = {g for pid in victim.session_pids() for g in guards(pid, "vllm.entrypoints")}
        while _running(guard) == 0:  # iteration 1's chunks are on the victim's instance
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "iteration 1's rollout never reached the victim"
            time.sleep(0.02)
        seer_pids = _node_processes(cluster, victim)
        assert any(b"vllm.entrypoints" in Path(f"/proc/{p}/cmdline").read_bytes() for p in seer_pids if _alive(p))
        cluster.lose(victim)
        lost_at = time.monotonic()
        left = seer_pids
        while left and time.monotonic() - lost_at < ORPHANS_GONE.limit():
            left = [p for p in left if _alive(p)]
            time.sleep(0.2)
        gone_s = time.monotonic() - lost_at
        run = _finished(job, log, run_dir, timeout_s=600)
    finally:
        if job.poll() is None:
            job.kill()
        cluster.revive(victim)
    return NodeLoss(run, lost_at, gone_s, left)


def test_a_run_places_an_instance_and_a_store_on_each_node(ray_two_nodes, two_rank_run):
    cluster, run = ray_two_nodes, two_rank_run
    ids = cluster.alive_nodes()
    assert set(ids) == {"127.0.0.3", "127.0.0.4"}, ids
    text, run_dir = run.text, run.run_dir
    placed = _placed(text)
    assert sorted(p[0] for p in placed.values()) == ["127.0.0.3", "127.0.0.4"], text[-3000:]
    for name, (ip, node_id, host, cores) in placed.items():
        assert node_id == ids[ip], (name, node_id, ids)  # the node Ray says it runs on
        assert host == ip  # the server is bound to its node's address
        assert cores == next(n.cores for n in cluster.nodes if n.ip == ip)  # and on its node's cores
    # the iteration's timeline has a track per instance, named with its node
    trace = json.loads((run_dir / "rollouts" / "iter_0001.trace.json").read_text())
    tracks = {ev["args"]["name"] for ev in trace["traceEvents"] if ev["ph"] == "M" and ev["name"] == "process_name"}
    assert {f"{name} on {ip}" for name, (ip, *_) in placed.items()} <= tracks, tracks
    # a store per node, started by that node's Ray worker and bound to its address
    assert run.stores == {"127.0.0.3": "127.0.0.3", "127.0.0.4": "127.0.0.4"}, run.stores
    assert re.search(r"a store of 16 MiB on each node: 127\.0\.0\.\d, 127\.0\.0\.\d", text)

    # the secret reached both instances, and nothing of the run directory holds it or Ray's token
    secrets = run.secrets
    assert len(secrets) == 1 and len(next(iter(secrets))) >= 32, secrets
    ray_token = Path(cluster.env()["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    for f in [f for f in run_dir.rglob("*") if f.is_file()]:
        data = f.read_bytes()
        assert not any(t.encode() in data for t in (*secrets, ray_token)), f"a secret is written in {f}"

    recs = run.records
    assert [r["iteration"] for r in recs] == [0, 1, 2]
    assert all(r["num_samples"] == 16 for r in recs)
    assert [r["weight_version"] for r in recs] == [0, 1, 2]
    for r in recs:  # before and after each weight update
        assert r["chunks_migrated"] > 0, r  # every continuation moved to the other node
        assert r["migrated_prefix_tokens_cached"] > 0, {k: r.get(k) for k in (
            "chunks_migrated", "migrated_prefix_tokens", "migrated_prefix_tokens_cached")}
        assert r["reward_mean"] is not None
    assert all(r["logprob_mismatch_mean"] < 1e-4 for r in recs), [
        (r.get("logprob_mismatch_mean"), r.get("logprob_mismatch_max")) for r in recs]


def test_a_node_lost_mid_rollout_costs_no_sample_and_leaves_no_process(node_loss_run):
    loss = node_loss_run
    run_dir, lost_at = loss.run.run_dir, loss.lost_at
    assert not loss.left, f"processes of the lost node still run: {loss.left}"
    text = loss.run.text
    drops = [line for line in text.splitlines() if "dropped" in line]
    assert drops and "on node 127.0.0.4" in drops[0], text[-3000:]
    recs = loss.run.records
    assert [r["iteration"] for r in recs] == [0, 1]
    assert all(r["num_samples"] == 16 for r in recs)  # no sample lost
    assert [r["weight_version"] for r in recs] == [0, 1]
    [d] = recs[1]["instances_dropped"]  # dropped mid-rollout: its chunks finished on the other node
    assert "127.0.0.4" in d["reason"], d
    rollout = [json.loads(x) for x in (run_dir / "rollouts" / "iter_0001.jsonl").read_text().splitlines()]
    started = min(r["start_time"] for r in rollout)  # the first chunk's dispatch, on the driver's clock
    after_loss = started + d["t"] - lost_at
    NODE_DROP.check(after_loss, what=(started, d, lost_at))
    assert [i["name"] for i in recs[1]["instances"]] and len(recs[1]["instances"]) >= 1
    record("run_node_loss",
           {"dropped_after_loss_s": round(after_loss, 2), "processes_gone_after_loss_s": round(loss.gone_s, 2),
            "rollout_s": recs[1]["wall_s"], "rollout_before_s": recs[0]["wall_s"]},
           "seer-run --sync on two simulated Ray nodes (127.0.0.3, 127.0.0.4, a core each), an instance and a "
           "store per node; every process of node 127.0.0.4's session SIGKILLed once iteration 1's rollout runs")


def _running(guard: int) -> int:
    """Requests the guard's vLLM server runs now (its /metrics, with the secret from its environment)."""
    import urllib.request

    from seer.procs.vllm_metrics import telemetry_from_metrics

    argv = Path(f"/proc/{guard}/cmdline").read_bytes().decode().split("\0")
    host, port = argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]
    [token] = _secret(guard)
    req = urllib.request.Request(f"http://{host}:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return telemetry_from_metrics("victim", r.read().decode()).num_running


def test_the_draft_server_serves_instances_on_both_nodes(ray_two_nodes, tiny_model, tmp_path):
    """`--set dgds.enabled=true`: the run launches its DGDS server on the driver's node, proposers on
    both nodes draft from their group's tree (greedy: siblings reproduce the probe, whatever node
    generated it), and vLLM's own spec-decode counters show accepted drafts on each instance. Fixed
    draft lengths (dgds.adaptive=false), so that the proposer drafts on every step."""
    cluster = ray_two_nodes
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    job = _job(cluster, run_dir, log, iterations=1, **{
        "kvpool.enabled": "false", "scheduler.policy": "context", "rollout.max_tokens": 128,
        "rollout.temperature": 0.0, "dgds.enabled": "true", "dgds.adaptive": "false",
        "dgds.num_speculative_tokens": 4})
    try:
        run = _finished(job, log, run_dir, timeout_s=900)
    finally:
        if job.poll() is None:
            job.kill()
    [rec] = run.records
    assert (run_dir / "dgds" / "dgds.log").exists()  # the run launched its own draft server
    assert foreign_entries(run_dir) == []  # all of it is Seer's: --overwrite can replace this run
    # the iteration's acceptance_length: from the instances' counters at the rollout's start and end
    assert rec["num_samples"] == 16 and rec["acceptance_length"] is not None and rec["acceptance_length"] > 1.0, rec
    assert sorted(p[0] for p in _placed(run.text).values()) == ["127.0.0.3", "127.0.0.4"]
    trace = json.loads((run_dir / "rollouts" / "iter_0000.trace.json").read_text())
    names = {ev["pid"]: ev["args"]["name"] for ev in trace["traceEvents"] if ev["ph"] == "M" and ev["name"] == "process_name"}
    accepted = {names[ev["pid"]] for ev in trace["traceEvents"]
                if ev["ph"] == "C" and ev["name"] == "acceptance_length" and ev["args"]["acceptance_length"] > 1.0}
    assert {n.split(" on ")[1] for n in accepted} == {"127.0.0.3", "127.0.0.4"}, accepted


def test_a_run_trains_with_two_data_parallel_ranks_on_two_nodes(two_rank_run, node_loss_run):
    """`--set trainer.data_parallel=2`: a rank on each node (gloo between 127.0.0.3 and 127.0.0.4),
    three iterations with rewards, versions and mismatch reported as at one rank."""
    run_dir, text, recs = two_rank_run.run_dir, two_rank_run.text, two_rank_run.records
    ranks = dict(re.findall(r"rank (\d) on (127\.0\.0\.\d)", text))
    assert set(ranks) == {"0", "1"} and sorted(ranks.values()) == ["127.0.0.3", "127.0.0.4"], text[-3000:]
    assert [r["iteration"] for r in recs] == [0, 1, 2]
    assert [r["weight_version"] for r in recs] == [0, 1, 2]
    assert all(r["num_samples"] == 16 and r["reward_mean"] is not None for r in recs)
    # the mismatch is measured on the pre-update weights, on both ranks' shards, as at one rank
    assert all(r["logprob_mismatch_mean"] < 1e-4 for r in recs), [r["logprob_mismatch_mean"] for r in recs]
    # a gradient exactly where some group had a reward spread (the tiny model often has none)
    assert all((r["grad_norm"] > 0) == (r["zero_adv_fraction"] < 1) for r in recs), [
        (r["grad_norm"], r["zero_adv_fraction"]) for r in recs]
    # the versions travelled through Ray (instances on two nodes): no export directory was written
    assert "weights travel through Ray" in text and not list(run_dir.glob("weights/*")), text[-2000:]
    assert all(sorted(r["node"] for r in rec["train_ranks"]) == ["127.0.0.3", "127.0.0.4"] for rec in recs[:2])
    trace = json.loads((run_dir / "rollouts" / "iter_0001.trace.json").read_text())
    threads = {ev["args"]["name"] for ev in trace["traceEvents"] if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert {f"rank {k} on {ip}" for k, ip in ranks.items()} <= threads, threads  # a timeline track per rank
    base = node_loss_run.run.records  # the one-rank run: its iteration 0 ran before the loss, on both nodes
    # iteration 0 rolls out the same base weights: the same reward within sampling noise
    assert abs(recs[0]["reward_mean"] - base[0]["reward_mean"]) < 0.25, (recs[0]["reward_mean"], base[0])
