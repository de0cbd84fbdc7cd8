"""The fleet's /health check before a weight update or a rollout: a live server that answers late
(a loaded machine) is asked again and kept; one whose process is gone is dropped at once."""

from __future__ import annotations

import asyncio
import socket
import time

from aiohttp import web

import seer.fleet.client as client_mod
import seer.fleet.fleet as fleet_mod
from seer.fleet import Fleet
from seer.fleet.pool import InstancePool


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_slow_health_answer_is_asked_again_and_a_gone_server_is_dropped_at_once(monkeypatch):
    monkeypatch.setattr(client_mod, "HEALTH_TIMEOUT_S", 0.3)
    monkeypatch.setattr(fleet_mod, "HEALTH_RECHECK_S", 5.0)
    asked = []

    async def health(request):
        asked.append(time.monotonic())
        if len(asked) == 1:
            await asyncio.sleep(1.0)  # past the first wait, well inside the second
        return web.Response(text="ok")

    async def go():
        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        port, gone = _free_port(), _free_port()  # nothing listens on `gone`
        await web.TCPSite(runner, "127.0.0.1", port).start()
        fleet = Fleet(InstancePool.connect([f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gone}"]))
        slow, dead = fleet.names
        try:
            t0 = time.monotonic()
            dropped = await fleet.drop_unhealthy("before the weight update")
            took = time.monotonic() - t0
        finally:
            for c in fleet.backends:
                await c.close()
            await runner.cleanup()
        return slow, dead, dropped, fleet.names, took

    slow, dead, dropped, left, took = asyncio.run(go())
    assert dropped == [dead] and left == [slow]
    assert len(asked) == 2  # the slow one was asked twice, and the second answer kept it
    assert took < 5.0  # the gone one did not wait out the second probe
