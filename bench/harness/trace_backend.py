"""Trace-driven generation: a real instance that stops each request at a hidden target length.

The benchmark's "model" for trace mode: every request (group, sample) has a target length drawn
from a heavy-tailed, group-correlated distribution (seer.sim.workloads). The wrapper sits where the
model's EOS would be, below the scheduler: it caps each chunk's max_tokens at what is left of
the target, asks vLLM for exactly that many tokens (`ignore_eos`), and reports "stop" when the
target is reached. The scheduler and its policies see only what they would see of a real model
(tokens, and an EOS at the end); the oracle alone is handed the table, through its constructor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from seer import request_ids
from seer.types import InstanceBackend, Telemetry
from seer.types import GenerateRequest, GenerateResult

from seer.sim.workloads import LengthKey


class TraceBackend:
    """An InstanceBackend over `inner` whose responses end at the hidden lengths."""

    def __init__(self, inner: InstanceBackend, hidden: Mapping[LengthKey, int], prompt_lens: Mapping[int, int]):
        self.inner = inner
        self.name = inner.name
        self._hidden = dict(hidden)
        self._prompt_lens = dict(prompt_lens)  # group -> prompt tokens, to know how much was generated

    def _key(self, request_id: str) -> LengthKey:
        sid = request_ids.parse(request_id)
        if sid is None:
            raise ValueError(f"trace mode needs scheduler request ids, got {request_id!r}")
        return sid.group_index, sid.sample

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        group, sample = self._key(req.request_id)
        done = len(req.prompt_ids) - self._prompt_lens[group]
        return await self.capped(req, self._hidden[(group, sample)] - done)

    async def capped(self, req: GenerateRequest, left: int, **changes) -> GenerateResult:
        """`req` for at most `left` more tokens with EOS ignored, reported "stop" once they are out."""
        n = max(1, min(req.max_tokens, left))
        sampling = replace(req.sampling, max_tokens=n, ignore_eos=True)
        out = await self.inner.generate(replace(req, max_tokens=n, sampling=sampling, **changes))
        if out.finish_reason != "abort" and len(out.token_ids) >= left:
            out = replace(out, finish_reason="stop")
        return out

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def telemetry(self) -> Telemetry:
        return await self.inner.telemetry()

    async def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()
