"""The calculator task as a program: `task.agent: python -m seer.tasks.agents.calculator_command`
(`--latency-median-s 0`: no tool latency).

A command-line agent learns its session from its environment: the `openai` client reads
OPENAI_BASE_URL and OPENAI_API_KEY itself; SEER_MODEL names the model, SEER_RECORD holds the
record as JSON, and the reward goes to the file SEER_REWARD_FILE names (none written: the task's
reward function decides). A synchronous client, as many scripts have.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from openai import OpenAI

from seer.tasks.agents.calculator_tool import CALC_TOOL, CalculatorTool


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-median-s", type=float, default=0.08)
    parser.add_argument("--latency-sigma", type=float, default=0.7)
    args = parser.parse_args(argv)
    record = json.loads(os.environ["SEER_RECORD"])
    calc = CalculatorTool(record["reference"], args.latency_median_s, args.latency_sigma)
    messages = [{"role": "user", "content": record["prompt"]}]
    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    model = os.environ.get("SEER_MODEL") or client.models.list().data[0].id
    reward = None
    while reward is None:
        choice = client.chat.completions.create(model=model, messages=messages,
                                                tools=[CALC_TOOL]).choices[0]
        said = choice.message.content or ""
        if not choice.message.tool_calls:
            reward = calc.finish(said, choice.finish_reason)
            break
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls:
            answer = asyncio.run(calc(json.loads(call.function.arguments)["expression"], said))
            if answer is None:
                reward = calc.reward()
                break
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
    with open(os.environ["SEER_REWARD_FILE"], "w") as f:
        f.write(f"{reward}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
