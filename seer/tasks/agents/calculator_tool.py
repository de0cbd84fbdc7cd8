"""The calculator as an agent's function tool: `calc("0023-8")` answers "0015".

The tool keeps one session's count (seer.tasks.calculator.Countdown, the rules the calculator's
`Environment` applies), so an agent that uses it ends and scores a trajectory exactly where the
environment would. With the embedded models' chat format (seer.model.chat) a call renders as
`<calc>0023-8</calc>` and its answer as `=0015` and a newline: the environment's own tokens.
"""

from __future__ import annotations

import asyncio

from seer.tasks.calculator import CALL_END, Countdown, tool_latency_s

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Subtract a digit: 'A-D' answers A minus D, zero-padded to A's width.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "A-D, e.g. 0023-8"}},
            "required": ["expression"],
        },
    },
}


class CalculatorTool:
    """One session's calculator. `latency_median_s`, `latency_sigma`: the environment's tool latency
    (lognormal, awaited: the agent's event loop is not blocked; recorded ones when the reference
    holds `latencies`, as the environment's)."""

    def __init__(self, reference: dict, latency_median_s: float = 0.08, latency_sigma: float = 0.7) -> None:
        self.reference, self.count = reference, Countdown.of(reference)
        self.latency_median_s, self.latency_sigma = latency_median_s, latency_sigma
        self.calls = 0

    async def __call__(self, expression: str, said: str = "") -> str | None:
        """The answer to `expression`, or None when the call slips and the session must end.
        `said`: what the model wrote before the call in the same turn (a turn must be the call alone)."""
        call = self.count.parse(f"{said}<calc>{expression}{CALL_END}")
        if call is None:
            return None
        await asyncio.sleep(tool_latency_s(self.latency_median_s, self.latency_sigma, self.reference, self.calls))
        self.calls += 1
        left = self.count.take(*call)
        return None if left is None else f"{left:0{self.count.width}d}"

    def finish(self, said: str, finish_reason: str | None) -> float:
        """The reward when the model answers without a call (`finish_reason` "stop": it ended the turn)."""
        return self.count.end(said, ended_with_eos=finish_reason == "stop")

    def reward(self) -> float:
        """The reward of a session that ended on a slip (or was cut short)."""
        return self.count.partial()
