"""A pool of vLLM instances: launched here, or connected to by URL (a cluster deployment).

Launched instances are always shut down: on normal exit, on error, on Ctrl-C (context manager
plus atexit), and on a SIGKILL of this process (seer.procs.guard).
"""

from __future__ import annotations

import asyncio
import atexit
import time
from collections.abc import Callable
from pathlib import Path

from seer.types import Telemetry
from seer.fleet.client import InstanceClient
from seer.fleet.instance import InstanceSpec, InstanceStartError, VLLMServer


class InstancePool:
    def __init__(self, clients: list[InstanceClient], servers: list[VLLMServer] | None = None):
        if not clients:
            raise ValueError("an instance pool needs at least one instance")
        self.clients = clients
        self.servers = servers or []
        self._closed = False
        if self.servers:
            atexit.register(self.close)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def connect(cls, urls: list[str], model: str | None = None, token: str | None = None) -> "InstancePool":
        return cls([InstanceClient(f"inst{i}", u, model, token=token) for i, u in enumerate(urls)])

    @classmethod
    def launch(cls, *args, **kwargs) -> "InstancePool":
        """`alaunch` from code that runs no event loop (benchmarks, test fixtures)."""
        return asyncio.run(cls.alaunch(*args, **kwargs))

    @classmethod
    async def alaunch(
        cls,
        specs: list[InstanceSpec],
        log_dir: Path,
        ready_timeout_s: float = 600.0,
        on_ready: Callable[[str, float], None] | None = None,
    ) -> "InstancePool":
        """Start every server at once and wait until all answer /health, or raise with logs."""
        return await cls.astart([VLLMServer(s, Path(log_dir) / f"{s.name}.log") for s in specs],
                                ready_timeout_s, on_ready)

    @classmethod
    async def astart(
        cls,
        servers: list,
        ready_timeout_s: float = 600.0,
        on_ready: Callable[[str, float], None] | None = None,
    ) -> "InstancePool":
        """Start servers built elsewhere (here, or on a cluster's nodes: seer.fleet.ray_hosts), each
        with a `spec` that `start()` completes, and wait until all answer /health."""
        try:
            for srv in servers:  # in this thread: a guard's death signal follows the thread that started it
                srv.start()
        except BaseException:
            for srv in servers:
                srv.stop()
            raise
        specs = [srv.spec for srv in servers]
        pool = cls([InstanceClient(s.name, s.url, "seer-policy", token=s.token) for s in specs], servers)
        try:
            await pool._wait_ready(ready_timeout_s, on_ready)
        except BaseException:
            pool.close()
            raise
        return pool

    async def _wait_ready(self, timeout_s: float, on_ready) -> None:
        deadline = time.monotonic() + timeout_s
        pending = dict(zip([c.name for c in self.clients], zip(self.clients, self.servers)))
        try:
            while pending:
                for name, (client, server) in list(pending.items()):
                    if not server.alive():
                        raise InstanceStartError(
                            f"vLLM instance {name} exited during start-up (code {server.returncode}); "
                            f"log {server.log_path}:\n{server.log_tail()}"
                        )
                    if await client.healthy():
                        del pending[name]
                        if on_ready:
                            on_ready(name, time.monotonic() - server.started_at)
                if time.monotonic() > deadline:
                    name, (_, server) = next(iter(pending.items()))
                    raise InstanceStartError(
                        f"vLLM instance {name} not ready after {timeout_s:.0f}s; log {server.log_path}:\n{server.log_tail()}"
                    )
                if pending:
                    await asyncio.sleep(1.0)
        finally:
            for c in self.clients:
                await c.close()  # sessions are bound to this event loop

    # ---- use ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [c.name for c in self.clients]

    def server(self, name: str) -> VLLMServer:
        return next(s for s in self.servers if s.spec.name == name)

    async def telemetry(self) -> list[Telemetry]:
        return list(await asyncio.gather(*(c.telemetry() for c in self.clients)))

    def drop(self, name: str) -> None:
        """Take a dead or hung instance out of the pool for good. A server we launched is killed
        (a stopped one would never act on SIGTERM) so it holds no cores or memory. The last
        instance cannot be dropped."""
        if len(self.clients) <= 1:
            raise RuntimeError(f"cannot drop {name}: it is the last instance")
        self.clients = [c for c in self.clients if c.name != name]
        for srv in [s for s in self.servers if s.spec.name == name]:
            srv.kill()
            self.servers.remove(srv)

    async def aclose_clients(self) -> None:
        for c in self.clients:
            await c.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for srv in self.servers:
            srv.terminate()  # guards stop their servers in parallel
        for srv in self.servers:
            srv.stop()

    def __enter__(self) -> "InstancePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
