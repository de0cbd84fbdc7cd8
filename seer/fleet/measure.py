"""Run one chunk on one instance and report what it took from the pool.

Kept apart from the driver: the scheduler's ChunkEvent already carries vLLM's per-request
`cached_prefix_tokens` (pool + local cache together); this splits a chunk's prefix by source
from the instance's counters, which is exact when the instance runs that chunk alone (tests,
benchmarks, the docs' numbers).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from seer.fleet.client import InstanceClient
from seer.kvpool.accounting import PoolCounters, PoolUsage, usage_between
from seer.types import GenerateRequest, GenerateResult

# vLLM publishes a step's stats shortly after the step; a response can arrive first.
SETTLE_S = 0.3


@dataclass(frozen=True)
class MeasuredChunk:
    result: GenerateResult
    usage: PoolUsage

    @property
    def wall_s(self) -> float:
        return self.result.finish_time - self.result.start_time


async def counters(client: InstanceClient) -> PoolCounters:
    return PoolCounters.from_metrics(await client.metrics_text())


async def generate_measured(
    client: InstanceClient, req: GenerateRequest, kv_bytes_per_token: int | None = None
) -> MeasuredChunk:
    """generate() bracketed by two counter snapshots of the same instance."""
    before = await counters(client)
    result = await client.generate(req)
    await asyncio.sleep(SETTLE_S)
    after = await counters(client)
    expected = result.prompt_tokens
    for _ in range(20):  # wait until this chunk's prefill is fully accounted for
        if usage_between(before, after, kv_bytes_per_token).prompt_tokens >= expected:
            break
        await asyncio.sleep(0.1)
        after = await counters(client)
    return MeasuredChunk(result, usage_between(before, after, kv_bytes_per_token))
