"""Weight sync without a shared filesystem, on the real two-node Ray cluster (127.0.0.3 and .4, a
core each, each node its own --temp-dir): a version's files exist only in Ray (put by a "trainer"
actor on the second node, no export directory anywhere), reach each node's own directory, are
checked by size and sha256 on the node and again by every worker before they are applied, and the
instances then serve exactly what transformers computes from those weights. A corrupt copy is
refused (the instance keeps its version) and re-delivered; an instance that fails twice is dropped
with the reason; the last instance is never dropped.

One job (tests/fleet/weight_sync_job.py) runs the whole scenario on one fleet start-up; each test
asserts one part of its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

JOB = Path(__file__).with_name("weight_sync_job.py")


@pytest.fixture(scope="module")
def report(ray_two_nodes, tiny_model, tmp_path_factory) -> dict:
    cluster = ray_two_nodes
    work = tmp_path_factory.mktemp("weight-sync")
    out, log = work / "report.json", work / "job.log"
    cmd = [sys.executable, str(JOB), "--address", cluster.address, "--node-ip", cluster.nodes[0].ip,
           "--model", str(tiny_model), "--work", str(work / "run"), "--out", str(out)]
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=cluster.env(), timeout=780).returncode
    assert rc == 0 and out.exists(), log.read_text()[-6000:]
    rep = json.loads(out.read_text())
    rep["node_tmp"] = {n.ip: str(cluster.tmp / f"n{k}") for k, n in enumerate(cluster.nodes)}
    return rep


def test_weights_reach_an_instance_on_another_node_through_ray_only(report):
    rep = report
    assert sorted(rep["placed"].values()) == ["127.0.0.3", "127.0.0.4"], rep["placed"]
    assert rep["payload_node"] == "127.0.0.4"  # the versions live in the second node's object store
    assert rep["v0"]["transport"] == "ray"  # auto: an instance is off the driver's node
    assert rep["v0"]["versions"] == {"inst0": 0, "inst1": 0}
    assert all(g == rep["hf"]["v0"] for g in rep["v0"]["greedy"].values())
    a = rep["a"]
    assert a["versions"] == {"inst0": 1, "inst1": 1}
    assert rep["hf"]["v1"] != rep["hf"]["v0"]  # the update changes what greedy decoding says ...
    assert all(g == rep["hf"]["v1"] for g in a["greedy"].values()), (a["greedy"], rep["hf"]["v1"])  # ... exactly
    # delivered once to each node, into that node's own Ray session directory
    deliveries = a["deliveries"]
    assert sorted(deliveries) == ["127.0.0.3", "127.0.0.4"]
    dirs = {ip: Path(rec["dir"]) for ip, rec in deliveries.items()}
    assert len(set(dirs.values())) == 2
    for ip, d in dirs.items():
        assert d.is_relative_to(rep["node_tmp"][ip]), (ip, d, rep["node_tmp"])
        assert d.name == "v1" and "seer_weights" in d.parts
        assert deliveries[ip]["bytes"] > 400_000  # the tiny model's fp32 safetensors and its files


def test_a_corrupt_copy_is_refused_before_it_is_applied_then_redelivered(report):
    rep = report
    err, b1 = rep["b1_error"], rep["b1"]
    assert err and "model.safetensors" in err and "expected sha256" in err and "found" in err, err
    assert b1["version"] == 1  # still serving version 1, and version 1's weights
    assert b1["greedy"] == rep["hf"]["v1"]
    b2 = rep["b2"]
    assert b2["versions"] == {"inst0": 2, "inst1": 2} and not b2["dropped"], b2
    retried = [n for n in b2["notes"] if "re-delivering and retrying once" in n]
    assert len(retried) == 1 and retried[0].startswith(b1["instance"]) and "model.safetensors" in retried[0], b2["notes"]
    assert all(g == rep["hf"]["v2"] for g in b2["greedy"].values())


def test_an_instance_that_fails_twice_is_dropped_and_the_last_is_kept(report):
    rep = report
    b3 = rep["b3"]
    far = rep["b1"]["instance"]
    assert b3["names"] == [n for n in ("inst0", "inst1") if n != far], b3
    assert b3["versions"] == {b3["names"][0]: 3}
    [dropped] = b3["dropped"]
    assert dropped["instance"] == far
    reason = dropped["reason"]
    assert "weight version 3 failed to load, twice" in reason and "File exists" in reason, reason
    assert "127.0.0.4" in reason  # the node it was on
    assert any(n.startswith(f"instance {far} dropped") for n in b3["notes"]), b3["notes"]
    assert b3["greedy"] == {b3["names"][0]: rep["hf"]["v0"]}  # version 3 is the base model's weights
    assert b3["transport"] == "shared-fs"  # auto: the one instance left runs on the driver's node
    # the last instance refuses a payload that is not its manifest's, and serves version 3 on
    err = rep["b4_error"]
    assert err and "could not be loaded into any instance" in err and "model.safetensors: expected sha256" in err, err
    assert rep["b4"]["versions"] == b3["versions"] and rep["b4"]["greedy"] == b3["greedy"]
    assert rep["b4"]["names"] == b3["names"]
