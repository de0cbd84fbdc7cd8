"""The calculator task as an OpenAI Agents SDK agent.

    task.agent: seer.tasks.agents.calculator_sdk:agent

The SDK speaks the Responses API and sends traces to OpenAI by default: this agent uses the chat
completions model class with the session's own client (so concurrent sessions in one process never
share a client), and tracing is off. It returns None: the task's reward function
(seer.tasks.calculator:score, the calculator task's default) scores the session's transcript.
"""

from __future__ import annotations

from agents import (Agent, OpenAIChatCompletionsModel, RunConfig, Runner, ToolsToFinalOutputResult, function_tool,
                    set_tracing_disabled)
from openai import AsyncOpenAI

from seer.tasks.agents.calculator_tool import CalculatorTool
from seer.tasks.env import EnvConfig

set_tracing_disabled(True)


SLIP = "slip"  # the tool's answer to a call the environment would end the trajectory on


def stop_on_slip(context, results) -> ToolsToFinalOutputResult:
    """End the run on a slipped call, as the environment ends the trajectory (the model is not asked again)."""
    return ToolsToFinalOutputResult(is_final_output=any(r.output == SLIP for r in results), final_output=SLIP)


async def agent(base_url: str, api_key: str, session_id: str, record: dict, model: str | None = None,
                latency_median_s: float = 0.08, latency_sigma: float = 0.7, max_turns: int = EnvConfig.max_turns) -> None:
    tool = CalculatorTool(record["reference"], latency_median_s, latency_sigma)

    @function_tool(name_override="calc")
    async def calc(expression: str) -> str:
        """Subtract a digit: 'A-D' answers A minus D, zero-padded to A's width."""
        return await tool(expression) or SLIP

    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        model = model or (await client.models.list()).data[0].id  # the one model the gateway serves
        counter = Agent(name="calculator", tools=[calc], tool_use_behavior=stop_on_slip,
                        model=OpenAIChatCompletionsModel(model=model, openai_client=client))
        await Runner.run(counter, record["prompt"], max_turns=max_turns, run_config=RunConfig(tracing_disabled=True))
    return None
