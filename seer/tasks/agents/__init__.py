"""Agents for the calculator task, written the ways agent teams write them (docs/agents.md): each one
talks to the gateway only through the OpenAI API, and any of them can be `task.agent`.

- `calculator_openai:agent`: an ordinary `openai`-client loop with a function tool.
- `calculator_sdk:agent`: the OpenAI Agents SDK (chat completions API, tracing off).
- `calculator_command`: a program (`python -m seer.tasks.agents.calculator_command`), configured
  by its environment.

They share `calculator_tool` (the `calc` tool on the calculator's rules), so the three, and the
calculator's `Environment`, score a trajectory alike. Examples: they import nothing of Seer's but
the calculator task.
"""
