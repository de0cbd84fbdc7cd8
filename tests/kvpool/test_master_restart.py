"""A crashed mooncake_master, started again on its own address by `KVPool.ensure_master`: the
standalone store re-mounts its segment by itself and an existing store client (what each vLLM
instance's connector holds) puts and gets again without being set up anew. Real processes, no vLLM
(the same with vLLM inside: test_pool_integration.py's last test)."""

from __future__ import annotations

import time

from seer.kvpool import KVPool, KVPoolConfig
from seer.kvpool.processes import segment_mounted

MiB = 2**20


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
            assert took is not None and took < 30 and kv.master_alive()
            assert segment_mounted(ep, cfg.capacity_bytes)
            assert kv.endpoints == ep  # same address: the instances' Mooncake configs stay valid
            # the same client, not set up again: its first call may still fail while it reconnects
            t0 = time.monotonic()
            while client.put("after", value) != 0:
                assert time.monotonic() - t0 < 15, "the client did not reconnect to the restarted master"
                time.sleep(0.2)
            assert client.get("after") == value
            print(f"\nmaster restart: store segment re-mounted {took:.2f} s after the restart began; the existing "
                  f"client put again {time.monotonic() - t0:.2f} s after that")
            assert client.batch_is_exist(["before", "after"]) == [0, 1]  # the new master started empty
            stats = kv.master_stats()
            assert stats.keys == 1 and stats.capacity_bytes == cfg.capacity_bytes
        finally:
            client.close()
