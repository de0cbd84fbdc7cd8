"""The calculator task as an ordinary `openai`-client agent: a chat loop with one function tool.

    task.agent: seer.tasks.agents.calculator_openai:agent

It returns its own reward (the calculator's rules), so no task reward function is involved.
"""

from __future__ import annotations

import json

from openai import AsyncOpenAI

from seer.tasks.agents.calculator_tool import CALC_TOOL, CalculatorTool


async def agent(base_url: str, api_key: str, session_id: str, record: dict, model: str | None = None,
                latency_median_s: float = 0.08, latency_sigma: float = 0.7, http_client=None) -> float:
    calc = CalculatorTool(record["reference"], latency_median_s, latency_sigma)
    messages = [{"role": "user", "content": record["prompt"]}]
    # http_client: the runner's client for the gateway (with agent.mode: loop, no socket); None outside a run
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client) as client:
        model = model or (await client.models.list()).data[0].id  # the one model the gateway serves
        while True:
            reply = await client.chat.completions.create(model=model, messages=messages, tools=[CALC_TOOL])
            choice = reply.choices[0]
            said = choice.message.content or ""
            if not choice.message.tool_calls:  # the model answered without a call: done
                return calc.finish(said, choice.finish_reason)
            messages.append(choice.message.model_dump(exclude_none=True))
            for call in choice.message.tool_calls:
                answer = await calc(json.loads(call.function.arguments)["expression"], said)
                if answer is None:  # a slip ends the session
                    return calc.reward()
                messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
