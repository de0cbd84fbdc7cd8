"""A crashed mooncake_master, started again on its own address by `KVPool.ensure_master`: the
standalone store re-mounts its segment by itself and an existing store client (what each vLLM
instance's connector holds) puts and gets again without being set up anew. Real processes, no vLLM
(the same with vLLM inside: test_pool_integration.py's last test).

docs/failures.md's bounds (tests/failure_record.py's RECORDS): the store's segment is mounted again
within REMOUNT of the restart's start, and the existing client puts again within RECONNECT after
that. With SEER_RECORD=1 the times go to bench/results/failures/kv_master_restart.json."""

from __future__ import annotations

import time

from failure_record import bound, record
from seer.kvpool import KVPool, KVPoolConfig
from seer.kvpool.processes import segment_mounted

MiB = 2**20
REMOUNT = bound("kv_master_restart", "segment_remounted_after_restart_began")
RECONNECT = bound("kv_master_restart", "client_put_again_after_that")


def test_a_crashed_master_is_restarted_and_an_existing_client_reconnects(tmp_path, monkeypatch):
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    from mooncake.store import MooncakeDistributedStore

    cfg = KVPoolConfig(capacity_bytes=16 * MiB, local_buffer_bytes=16 * MiB)
    value = b"kv" * 50_000
    with KVPool.start(cfg, tmp_path) as kv:
        assert kv.ensure_master() is None  # up: nothing to do
        ep = kv.endpoints
        client = MooncakeDistributedStore()
        # calling a store whose setup failed crashes the process: check before any call
        assert client.setup("127.0.0.1", ep.metadata_server, 0, 16 * MiB, "tcp", "", ep.master_address) == 0
        try:
            assert client.put("before", value) == 0 and client.get("before") == value
            kv.master.kill()  # a crash: no clean shutdown
            assert kv.master_alive() is False
            took = kv.ensure_master()
            assert took is not None and kv.master_alive(), took
            REMOUNT.check(took)
            assert segment_mounted(ep, cfg.capacity_bytes)
            assert kv.endpoints == ep  # same address: the instances' Mooncake configs stay valid
            # the same client, not set up again: its first call may still fail while it reconnects
            t0 = time.monotonic()
            while client.put("after", value) != 0:
                RECONNECT.check(time.monotonic() - t0, what="the client did not reconnect to the restarted master")
                time.sleep(0.2)
            reconnect = time.monotonic() - t0
            assert client.get("after") == value
            assert client.batch_is_exist(["before", "after"]) == [0, 1]  # the new master started empty
            stats = kv.master_stats()
            assert stats.keys == 1 and stats.capacity_bytes == cfg.capacity_bytes
            record("kv_master_restart",
                   {"segment_remounted_after_restart_began_s": round(took, 2),
                    "client_put_again_after_that_s": round(reconnect, 2)},
                   "mooncake_master SIGKILLed, KVPool.ensure_master restarts it on its address; no vLLM")
        finally:
            client.close()
