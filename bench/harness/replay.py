"""Replaying scripted multi-turn trajectories on real instances (seer.sim.scripts' `Script`s).

The model generates exactly each script's turn lengths again (`ReplayBackend`, as
bench.harness.trace_backend does for single turns), and the tool answers with the recorded
observation after the recorded latency (`ReplayEnv`), without workers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from seer import request_ids
from seer.scheduler.turns import TurnEnd, TurnReply
from seer.sim.scripts import Script
from seer.sim.workloads import LengthKey
from seer.types import GenerateRequest, GenerateResult, InstanceBackend

from bench.harness.trace_backend import TraceBackend


@dataclass
class ReplayTable:
    """The iteration's scripts by (group, sample) of its request ids, and its prompts' lengths."""

    scripts: dict[LengthKey, Script]
    prompt_lens: dict[int, int]

    def key(self, request_id: str) -> LengthKey:
        sid = request_ids.parse(request_id)
        if sid is None:
            raise ValueError(f"replay needs scheduler request ids, got {request_id!r}")
        return sid.group_index, sid.sample


class ReplayBackend(TraceBackend):
    """An InstanceBackend over `inner` whose turns end at the scripted lengths.

    Each chunk asks vLLM for at most what is left of its turn, with EOS and the environment's stop
    strings off, and is reported "stop" when the turn is complete (TraceBackend.capped): a
    StopMatcher without stop sequences then ends the turn there (seer.scheduler.turns)."""

    def __init__(self, inner: InstanceBackend, table: ReplayTable):
        super().__init__(inner, {}, {})
        self.table = table  # replaced by the benchmark between iterations

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        t = self.table
        group, sample = t.key(req.request_id)
        left = t.scripts[(group, sample)].turn_left(len(req.prompt_ids) - t.prompt_lens[group])
        return await self.capped(req, left, stop=())


class ReplayEnv:
    """The driver's `on_turn_end` for scripted trajectories: the recorded observation after the
    recorded latency (an asyncio sleep: a tool that waits, not one that computes), done after the
    last turn."""

    def __init__(self, table: ReplayTable, sleep=asyncio.sleep):
        self.table = table
        self.sleep = sleep

    async def __call__(self, end: TurnEnd) -> TurnReply:
        r = end.request
        script = self.table.scripts[(r.group_id, r.sample_index)]
        if end.reason == "length" or end.turn >= len(script.turns):
            return TurnReply(done=True)
        if script.latency_s[end.turn] > 0:
            await self.sleep(script.latency_s[end.turn])
        return TurnReply(script.obs[end.turn])
