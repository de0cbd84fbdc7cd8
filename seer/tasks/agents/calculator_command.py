"""The calculator task as a program: `task.agent: python -m seer.tasks.agents.calculator_command`
(`--latency-median-s 0`: no tool latency).

A command-line agent learns its session from its environment: the `openai` client reads
OPENAI_BASE_URL and OPENAI_API_KEY itself; SEER_MODEL names the model, SEER_RECORD holds the
record as JSON, and the reward goes to the file SEER_REWARD_FILE names (none written: the task's
reward function decides). A synchronous client, as many scripts have. With `--serve` (and
`agent.serve: true`) one process serves every session (seer.tasks.agents.serve_sessions), each on a
thread with its own client: the interpreter's start and the imports are paid once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from openai import OpenAI

from seer.tasks.agents.calculator_tool import CALC_TOOL, CalculatorTool


def play(client: OpenAI, model: str, record: dict, args: argparse.Namespace) -> float:
    calc = CalculatorTool(record["reference"], args.latency_median_s, args.latency_sigma)
    messages = [{"role": "user", "content": record["prompt"]}]
    model = model or client.models.list().data[0].id
    while True:
        choice = client.chat.completions.create(model=model, messages=messages,
                                                tools=[CALC_TOOL]).choices[0]
        said = choice.message.content or ""
        if not choice.message.tool_calls:
            return calc.finish(said, choice.finish_reason)
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls:
            answer = asyncio.run(calc(json.loads(call.function.arguments)["expression"], said))
            if answer is None:
                return calc.reward()
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-median-s", type=float, default=0.08)
    parser.add_argument("--latency-sigma", type=float, default=0.7)
    parser.add_argument("--serve", action="store_true", help="serve many sessions (agent.serve: true)")
    args = parser.parse_args(argv)
    if args.serve:
        from seer.tasks.agents.serve_sessions import serve

        def handle(session: dict) -> float:
            with OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0) as client:
                return play(client, session["model"], session["record"], args)

        serve(handle)
        return
    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    reward = play(client, os.environ.get("SEER_MODEL", ""), json.loads(os.environ["SEER_RECORD"]), args)
    with open(os.environ["SEER_REWARD_FILE"], "w") as f:
        f.write(f"{reward}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
