"""The fleet on real processes: launch with a KV pool, weight push and version check, a lost KV
master restarted, a dead instance dropped (and the last one never)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from failure_record import bound
from seer.dgds.server.config import DGDSConfig
from seer.fleet import Fleet, FleetError, LaunchSettings
from seer.fleet.config import InstancesConfig
from seer.fleet.weights import StaleWeightsError
from seer.kvpool.config import KVPoolConfig
from tests.sockets import process_tree
from seer.types import WeightsRef

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

# docs/failures.md's bound for a weight update that finds an instance dead (tests/failure_record.py)
SYNC_WITH_DEAD = bound("run_instance_loss_training", "weight_update_with_dead_instance")


def test_fleet_launches_pushes_checks_revives_and_drops(tiny_model, tmp_path, ray_session):
    notes: list[str] = []
    cores = len(os.sched_getaffinity(0))

    async def go():
        fleet = await Fleet.launch(
            InstancesConfig(count=min(2, cores), kv_cache_bytes=32 * 2**20, max_num_seqs=16),
            KVPoolConfig(capacity_bytes=16 * 2**20, local_buffer_bytes=16 * 2**20),
            DGDSConfig(enabled=False),
            LaunchSettings(str(tiny_model), max_model_len=1024),
            tmp_path, notes.append)
        async with fleet:
            assert fleet.launched and fleet.kv_pool_on and len(fleet.backends) == min(2, cores)
            # one Ray actor per instance, each server bound to its node's address, on its own cores
            assert [s.spec.host for s in fleet.pool.servers] == [s.node.ip for s in fleet.pool.servers]
            assert sorted(s.spec.cpus for s in fleet.pool.servers) == [str(c) for c in sorted(os.sched_getaffinity(0))][:2]
            assert len(fleet.kv.stores) == 1  # one store per node that hosts instances
            server_pids = [p for s in fleet.pool.servers for p in process_tree(s.pids()[0])]
            await _nothing_open_to_strangers(fleet)
            assert await fleet.versions() == {n: 0 for n in fleet.names}
            await fleet.prepare_rollout(0)  # every instance serves version 0: the rollout may start

            # a new version (the same weights, a new number) lands on every instance
            took = await fleet.weights.push(WeightsRef(1, str(tiny_model)))
            assert took > 0 and await fleet.versions() == {n: 1 for n in fleet.names}
            with pytest.raises(StaleWeightsError, match="refusing to start rollout for weight version 2"):
                await fleet.prepare_rollout(2)
            assert await fleet.weights.ensure(WeightsRef(1, str(tiny_model))) is None  # already served

            # the KV master launched here dies: the fleet restarts it before the next rollout
            fleet.kv.master.kill()
            t0 = time.monotonic()
            while fleet.kv.master.alive() and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.05)
            revived = await fleet.revive_services("in the test")
            assert revived is not None and revived < 30, revived
            assert any("Mooncake master had exited" in n for n in notes)

            if len(fleet.backends) < 2:
                return
            # an instance dies between rollouts: dropped by the health probe, the push goes on
            victim = fleet.names[0]
            for pid in fleet.pool.server(victim).pids()[1:]:  # the server's group (and the guard's sentinel)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            t0 = time.monotonic()
            await fleet.weights.push(WeightsRef(2, str(tiny_model)))
            SYNC_WITH_DEAD.check(time.monotonic() - t0, base_s=took)  # `took`: the update with both alive
            assert fleet.names == [n for n in fleet.names if n != victim] and len(fleet.names) == 1
            assert await fleet.versions() == {fleet.names[0]: 2}
            assert [d.instance for d in fleet.dropped] == [victim]
            assert any(victim in n and "dropped" in n for n in notes)
            with pytest.raises(FleetError, match="every instance"):
                fleet.drop(fleet.names[0], "test", "in the test")  # the last instance is never dropped
            assert len(fleet.backends) == 1
        assert not any(s.alive() for s in fleet.pool.servers)  # closed: nothing left running
        deadline = time.monotonic() + 30
        while [p for p in server_pids if _running(p)] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert not [p for p in server_pids if _running(p)], "a server process outlived the fleet"

    asyncio.run(go())


async def _nothing_open_to_strangers(fleet) -> None:
    """Without the run's secret only /health answers (seer.fleet.auth), on vLLM's /v1 routes and its
    dev-mode routes alike; the secret is on no command line; nothing listens on a wildcard address."""
    import aiohttp

    from tests.sockets import command_lines, listening, process_tree

    url = fleet.backends[0].base_url
    async with aiohttp.ClientSession() as s:
        for method, path in [("post", "/v1/completions"), ("post", "/collective_rpc"),
                             ("post", "/reset_prefix_cache"), ("get", "/metrics"), ("get", "/v1/models")]:
            async with getattr(s, method)(url + path, json={}) as r:
                assert r.status == 401, (path, r.status)
        async with s.get(url + "/health") as r:
            assert r.status == 200
    token = fleet.pool.servers[0].spec.token
    assert token and len(token) >= 32
    pids = [p for srv in (*fleet.pool.servers, *fleet.kv.stores) for p in process_tree(srv.pids()[0])]
    pids += process_tree(fleet.kv.master.proc.pid)
    assert not any(token.encode() in c for c in command_lines(pids))
    # nor in what /proc shows of any process's environment (the secret reached each on a pipe:
    # seer.procs.secret_launch), and an agent's process reads no environment or memory of any of them
    from tests.agent.proc_probe import as_an_agent, holders, read_all

    _, environments = read_all(pids, ("environ",))
    assert len(environments) == len(pids) and not [e for e in environments if token in e]
    answers, got = as_an_agent(pids)
    assert not [t for t in got if token in t]
    secret_holders = holders(pids)  # each instance's API server, engine core and worker
    assert len(secret_holders) >= 3 * len(fleet.pool.servers), secret_holders
    assert all(answers[str(p)]["environ"] in ("EACCES", "EPERM") and answers[str(p)]["mem"] in ("EACCES", "EPERM")
               for p in secret_holders), answers
    addresses = listening(pids)
    assert addresses, "found no listening socket at all: the check itself is broken"
    wildcard = {a for a in addresses if a[0] in ("0.0.0.0", "::")}
    # The two Mooncake listeners docs/cluster.md names ("what listens where"):
    # the transfer engine's handshake port (15000-17000, no bind option) and the master's HTTP
    # metadata server (its host flag is not honoured by this build).
    metadata_port = int(fleet.kv.endpoints.metadata_server.rsplit(":", 1)[1].split("/")[0])
    unexplained = {a for a in wildcard if not (15000 <= a[1] <= 17000 or a[1] == metadata_port)}
    assert not unexplained, f"listening on every interface: {sorted(unexplained)}"
    for srv in fleet.pool.servers:  # the API server binds its host only
        assert (srv.spec.host, srv.spec.port) in addresses
        assert not {a for a in addresses if a[1] == srv.spec.port and a[0] != srv.spec.host}


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
