"""The one interface every dispatcher talks to: a real vLLM instance or a simulated one.

Policies and drivers depend only on this protocol, so the same scheduling code runs against
real instances (seer.rollout.client.InstanceClient) and against the discrete-event simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from seer.rollout.types import GenerateRequest, GenerateResult


@dataclass(frozen=True)
class Telemetry:
    """A snapshot of one instance's load, as its Prometheus /metrics reports it."""

    instance: str
    time: float
    kv_usage: float  # fraction of KV blocks in use, 0..1
    kv_capacity_tokens: int  # total KV slots (blocks * block size); 0 when unknown
    num_running: int
    num_waiting: int
    preemptions_total: int
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0  # KV-connector (pool) lookups
    external_prefix_cache_hits: int = 0
    block_size: int = 0  # tokens per KV block (vLLM allocates whole blocks); 0 when unknown

    @property
    def kv_free_tokens(self) -> int:
        return int(self.kv_capacity_tokens * (1.0 - self.kv_usage))


@runtime_checkable
class InstanceBackend(Protocol):
    """A generation engine that takes token ids in and gives token ids out."""

    name: str

    async def generate(self, req: GenerateRequest) -> GenerateResult: ...

    async def abort(self, request_id: str) -> None: ...

    async def telemetry(self) -> Telemetry: ...
