"""A command-line agent for seer-run's gateway test: a synchronous `openai` client configured only by
its environment (OPENAI_BASE_URL, OPENAI_API_KEY, SEER_MODEL, SEER_RECORD), as scripts are. Three
calls of the calculator tool with the test's system prompt; a reply without a tool call gets a nudge.
It writes no reward (the task's reward function scores the transcript)."""

from __future__ import annotations

import json
import os

from openai import OpenAI

from tests.gateway.agents_for_tests import CALC_TOOL, SYSTEM


def main() -> None:
    record = json.loads(os.environ["SEER_RECORD"])
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL, OPENAI_API_KEY
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": record["prompt"]}]
    for _ in range(3):
        reply = client.chat.completions.create(model=os.environ["SEER_MODEL"], messages=messages, tools=[CALC_TOOL],
                                               max_tokens=10)
        msg = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(msg)
        if msg.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "0001"})
        else:
            messages.append({"role": "user", "content": "\ngo on\n"})


if __name__ == "__main__":
    main()
