"""A real instance whose chunks run one at a time across all wrapped instances, in dispatch order
(asyncio.Lock is FIFO): completions then alternate between the instances whatever the machine's
load, so a policy that moves requests between them (FIFO, MoveEveryChunk) does so deterministically.
Shared by the KV-pool and routing-replay tests."""

from __future__ import annotations

import asyncio


class SerializedBackend:
    def __init__(self, inner, lock: asyncio.Lock):
        self.inner, self.name, self.lock = inner, inner.name, lock

    @property
    def routing(self):
        """The inner instance's routing capture (routing replay), if it has one."""
        return getattr(self.inner, "routing", None)

    async def generate(self, req):
        async with self.lock:
            return await self.inner.generate(req)

    async def abort(self, request_id):
        await self.inner.abort(request_id)

    async def telemetry(self):
        return await self.inner.telemetry()
