"""Agents as a plug point (`task.agent`): the interface the gateway's rollout drives.

MINIMAL STAND-IN written by the gateway branch so that its rollout and tests run before the agents
branch lands; the agents branch owns this module (its version replaces this one whole). It runs
`module:function` agents only: `async def agent(base_url, api_key, session_id, record) -> float | None`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class AgentSpec:
    target: str
    kind: str  # "function" | "command"
    timeout_s: float


@dataclass(frozen=True)
class AgentSession:
    session_id: str
    base_url: str  # the gateway's /v1 base URL
    api_key: str  # this session's own gateway key
    record: dict  # the task record (prompt text, reference)


@dataclass(frozen=True)
class AgentOutcome:
    reward: float | None  # None: leave it to the task's reward function on the final transcript
    error: str | None
    wall_s: float


class AgentRunner:
    def __init__(self, spec: AgentSpec, max_concurrent: int) -> None:
        from seer.plugins import resolve

        if spec.kind != "function":
            raise ValueError("this stand-in runs module:function agents only")
        self.spec = spec
        self.fn = resolve(spec.target, key="task.agent")
        self._slots = asyncio.Semaphore(max_concurrent)

    async def run(self, session: AgentSession) -> AgentOutcome:
        t0 = time.monotonic()
        async with self._slots:
            try:
                out = self.fn(session.base_url, session.api_key, session.session_id, session.record)
                if inspect.isawaitable(out):
                    out = await asyncio.wait_for(out, self.spec.timeout_s)
                return AgentOutcome(None if out is None else float(out), None, time.monotonic() - t0)
            except asyncio.TimeoutError:
                return AgentOutcome(0.0, f"agent timed out after {self.spec.timeout_s} s", time.monotonic() - t0)
            except Exception as e:
                return AgentOutcome(0.0, f"agent raised {e!r}", time.monotonic() - t0)

    async def close(self) -> None:
        return None
