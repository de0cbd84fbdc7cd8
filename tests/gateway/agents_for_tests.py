"""Agents the gateway tests run: ordinary `openai`-client loops with the calculator as a function tool."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import httpx

MODEL = "seer-policy"
CALC_TOOL = {"type": "function", "function": {
    "name": "calc", "description": "Subtract: 'A-D' gives A minus D, zero-padded to A's width.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
_EXPR = re.compile(r"(\d+)-(\d+)")


def calculator(expression: str, left: int) -> str | None:
    """The tool: None for a call the Environment would end the trajectory on."""
    m = _EXPR.fullmatch(expression)
    if m is None or int(m.group(1)) != left or not 1 <= int(m.group(2)) <= 9 or int(m.group(1)) < int(m.group(2)):
        return None
    return f"{int(m.group(1)) - int(m.group(2)):0{len(m.group(1))}d}"


async def calc_agent(base_url: str, api_key: str, session_id: str, record: dict, *, stream: bool = False,
                     max_tokens: int | None = None, max_calls: int = 20, http_client=None,
                     system: str | None = None) -> float | None:
    """Counts down with the calculator until the model stops calling it (reward: the task's function).
    It takes the runner's `http_client` (in loop mode: the gateway's handler in this process)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http_client)
    messages: list[dict] = [{"role": "user", "content": record["prompt"]}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    left = int(record["reference"]["total"])
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    try:
        for _ in range(max_calls):
            if stream:
                msg = await _streamed(client, messages, extra)
            else:
                r = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL], **extra)
                msg = r.choices[0].message.model_dump(exclude_none=True)
            messages.append(msg)
            calls = msg.get("tool_calls") or []
            if not calls:
                return None
            value = calculator(json.loads(calls[0]["function"]["arguments"])["expression"], left)
            if value is None:
                return None
            left = int(value)
            messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": value})
        return None
    finally:
        await client.close()


async def _streamed(client, messages, extra) -> dict:
    stream = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL], stream=True,
                                                  **extra)
    content, calls = "", []
    async for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for c in ch.delta.tool_calls or []:
                calls.append({"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}})
    msg: dict = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


async def streaming_calc_agent(base_url, api_key, session_id, record, http_client=None):
    return await calc_agent(base_url, api_key, session_id, record, stream=True, http_client=http_client)


async def rewriting_agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    """Three calculator calls, then context management: it drops its second exchange (the assistant
    call and the tool result) and asks again, which must branch the session, not re-tokenize it."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict] = [{"role": "user", "content": record["prompt"]}]
    left = int(record["reference"]["total"])
    try:
        for step in range(4):
            if step == 3:
                messages = messages[:3] + messages[5:]  # forget the second call and its result
            r = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL])
            msg = r.choices[0].message.model_dump(exclude_none=True)
            messages.append(msg)
            calls = msg.get("tool_calls") or []
            if not calls:
                break
            value = calculator(json.loads(calls[0]["function"]["arguments"])["expression"], left) or "0000"
            left = int(value)
            messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": value})
        return 0.5
    finally:
        await client.close()


BAD: dict[str, list] = {}  # session id -> [(what, status, error object)], for the test to read


async def bad_calls_agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    """Sends every kind of bad call first, records the answers, then runs the calculator normally."""
    url = f"{base_url}/chat/completions"
    good = {"model": MODEL, "messages": [{"role": "user", "content": record["prompt"]}], "tools": [CALC_TOOL]}
    two_params = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string"}}}}}
    auth = {"Authorization": f"Bearer {api_key}"}
    cases = [
        ("no key", {}, json.dumps(good)),
        ("forged key", {"Authorization": f"Bearer {api_key[:-4]}abcd"}, json.dumps(good)),
        ("bad json", auth, "{not json"),
        ("wrong model", auth, json.dumps({**good, "model": "gpt-4o"})),
        ("temperature", auth, json.dumps({**good, "temperature": 0.3})),
        ("n", auth, json.dumps({**good, "n": 2})),
        ("tool schema", auth, json.dumps({**good, "tools": [two_params]})),
        ("over-long", auth, json.dumps({**good, "messages": [{"role": "user", "content": "x" * 5000}],
                                        "max_tokens": 8})),
        ("too large", auth, json.dumps({**good, "messages": [{"role": "user", "content": "y" * (5 << 20)}]})),
        ("no messages", auth, json.dumps({**good, "messages": []})),
        # every field's type is checked before the call is its session's (a 500 here left an orphan
        # call that took the session's turn: the retry got 409 and the orphan trained as a branch)
        ("stream_options", auth, json.dumps({**good, "stream": True, "stream_options": "yes"})),
        ("stream", auth, json.dumps({**good, "stream": "yes"})),
        ("logprobs", auth, json.dumps({**good, "logprobs": "yes"})),
        ("tools", auth, json.dumps({**good, "tools": 5})),
        ("message content", auth, json.dumps({**good, "messages": [{"role": "user", "content": 5}]})),
        ("message role", auth, json.dumps({**good, "messages": [{"role": ["user"], "content": "x"}]})),
        ("non-ascii key", {"Authorization": f"Bearer {api_key}\u00e9".encode()}, json.dumps(good)),
        ("deep json", auth, '{"model": "%s", "messages": %s}' % (MODEL, "[" * 100_000 + "]" * 100_000)),
    ]
    out = BAD.setdefault(session_id, [])
    async with httpx.AsyncClient(timeout=60) as http:
        for what, headers, body in cases:
            r = await http.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
            out.append((what, r.status_code, r.json().get("error")))
        r = await http.get(f"{base_url}/models", headers=auth)
        out.append(("models", r.status_code, r.json()))
    return await calc_agent(base_url, api_key, session_id, record)


class Gate:
    """The tokenizer gate of the test of a long call (tests/gateway/test_gateway.py): `started` once the
    long call's text is being tokenized, `release` once another session's call got a turn meanwhile."""

    started = threading.Event()
    release = threading.Event()
    BIG: dict[str, tuple[int, dict]] = {}  # the session that sent a too large call: its answer


COUNT_DOWN = "Count down with the calculator tool, one digit at a time. " * 24  # over a thousand characters


async def long_call_agent(base_url: str, api_key: str, session_id: str, record: dict, http_client=None) -> float | None:
    """Group 0's session sends a call of 3 MB (under gateway.max_request_bytes, far past the model's
    context) over HTTP, then counts down behind a long system prompt; the others count down once
    group 0's long call is being tokenized."""
    if record["reference"]["total"] == 9:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "y" * (3 << 20)}]}
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {api_key}"})
        Gate.BIG[session_id] = (r.status_code, r.json().get("error"))
        return await calc_agent(base_url, api_key, session_id, record, system=COUNT_DOWN)
    for _ in range(3000):
        if Gate.started.is_set():
            break
        await asyncio.sleep(0.01)
    return await calc_agent(base_url, api_key, session_id, record, http_client=http_client)


KEYS: dict[str, tuple[str, str]] = {}


async def remembering_agent(base_url, api_key, session_id, record):
    """The calculator agent, which also leaves its key behind (to call again after its iteration)."""
    KEYS[session_id] = (base_url, api_key)
    return await calc_agent(base_url, api_key, session_id, record)


async def impatient_agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    """Gives up on its first call after a moment (the client disconnects), then runs normally."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": record["prompt"]}], "tools": [CALC_TOOL]}
    async with httpx.AsyncClient() as http:
        try:
            await http.post(f"{base_url}/chat/completions", json=body, timeout=0.3,
                            headers={"Authorization": f"Bearer {api_key}"})
        except httpx.TimeoutException:
            pass
    return await calc_agent(base_url, api_key, session_id, record)


async def impatient_agent_in_process(base_url: str, api_key: str, session_id: str, record: dict,
                                     http_client=None) -> float | None:
    """The same through the runner's in-process `http_client`: its read timeout is the going away."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": record["prompt"]}], "tools": [CALC_TOOL]}
    assert http_client is not None
    try:
        await http_client.post(f"{base_url}/chat/completions", json=body, timeout=0.3,
                               headers={"Authorization": f"Bearer {api_key}"})
    except httpx.TimeoutException:
        pass
    return await calc_agent(base_url, api_key, session_id, record, http_client=http_client)


# Longer than one KV block (128 tokens on vLLM's CPU backend): only full blocks go to the pool, so a
# session's history must fill one for a moved turn to load it from there.
SYSTEM = ("You count down to zero with the calculator tool. Call it with the current value and a digit, "
          "as in 0023-8, then continue from the value it returns. Stop once it returns zero.\n") * 2


SDK_SESSION, COMMAND_SESSION = "-s2", "-s3"  # which sessions of a group seer-run's test agent gives to whom


async def run_agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    """seer-run's test agent: one `task.agent` (module:function) that serves the three kinds of agent
    in one run, by session: s2 is an OpenAI Agents SDK agent (`sdk_agent`), s3 a command line (a
    program of its own, run by the runner's command mode: `command_agent`), the others the
    `openai`-client loop (`openai_agent`)."""
    if session_id.endswith(SDK_SESSION):
        return await sdk_agent(base_url, api_key, session_id, record)
    if session_id.endswith(COMMAND_SESSION):
        return await command_agent(base_url, api_key, session_id, record)
    return await openai_agent(base_url, api_key, session_id, record)


async def openai_agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    """An `openai`-client loop (any model, even an untrained one): three calls of a system prompt, the
    task and the calculator tool; a reply without a tool call gets a user nudge. Sessions s1 edit
    their history before the third call (they drop the first exchange): a branch."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": record["prompt"]}]
    try:
        for step in range(3):
            if step == 2 and session_id.endswith("-s1"):
                messages = messages[:2] + messages[4:]
            r = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL], max_tokens=10,
                                                     logprobs=True)
            choice = r.choices[0]
            assert choice.logprobs is not None and len(choice.logprobs.content) == r.usage.completion_tokens
            msg = choice.message.model_dump(exclude_none=True)
            messages.append(msg)
            if msg.get("tool_calls"):
                messages.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "0001"})
            else:
                messages.append({"role": "user", "content": "\ngo on\n"})
        return None  # the task's reward function scores the final transcript
    finally:
        await client.close()


async def sdk_agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    """An OpenAI Agents SDK agent (chat completions model, tracing off): the calculator as a function
    tool answering "0001"; two runs of the SDK's Runner, the second continuing the first's
    conversation with a nudge (an untrained model rarely calls the tool), so at least two calls."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    @function_tool(name_override="calc")
    async def calc(expression: str) -> str:
        """Subtract: 'A-D' gives A minus D, zero-padded to A's width."""
        return "0001"

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        counter = Agent(name="counter", instructions=SYSTEM, tools=[calc], model_settings=ModelSettings(max_tokens=10),
                        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
        conversation: list | str = record["prompt"]
        for _ in range(2):
            try:
                result = await Runner.run(counter, conversation, max_turns=3, run_config=RunConfig(tracing_disabled=True))
            except MaxTurnsExceeded:  # a model that only calls the tool: its calls were made
                return None
            conversation = result.to_input_list() + [{"role": "user", "content": "\ngo on\n"}]
    return None


async def command_agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    """The command-line agent `python -m tests.gateway.command_agent` run by the runner's own command
    mode (seer.rollout.agents: `AgentSpec.parse` of the command line, the agent host, the session's
    environment, its reward file, its process group ended), exactly as a `task.agent` command line is
    run: one run's sessions cover the function, SDK and command kinds without a run per kind."""
    import sys

    from seer.rollout.agents import AgentConfig, AgentRunner, AgentSession, AgentSpec

    spec = AgentSpec.parse(f"{sys.executable} -m tests.gateway.command_agent", 300.0, cfg=AgentConfig())
    assert spec.kind == "command"
    runner = AgentRunner(spec, 1)
    try:
        outcome = await runner.run(AgentSession(session_id, base_url, api_key, record, MODEL))
    finally:
        await runner.close()
    if outcome.error is not None:
        raise RuntimeError(f"the command agent failed: {outcome.error}")
    return outcome.reward


COMPLETION_LOGPROBS: dict[str, list[float]] = {}  # session id -> its calls' token log-probs, in order


async def completions_agent(base_url: str, api_key: str, session_id: str, record: dict, *,
                            stream: bool = False) -> float | None:
    """The calculator over /v1/completions: the agent keeps the transcript as text and appends results.
    Streamed: every piece but the last is exactly its tokens' text (from its own log-probs' offsets)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    text, left = record["prompt"], int(record["reference"]["total"])
    lps = COMPLETION_LOGPROBS.setdefault(session_id, [])
    try:
        for _ in range(20):
            if stream:
                out, pieces = "", []
                async for r in await client.completions.create(model=MODEL, prompt=text, max_tokens=32,
                                                               stop=["</calc>"], logprobs=1, stream=True):
                    c = r.choices[0]
                    pieces.append((c.text, c.logprobs.tokens, c.logprobs.text_offset))
                    lps.extend(c.logprobs.token_logprobs)
                    out += c.text
                for piece, tokens, offsets in pieces[:-1]:
                    assert "".join(tokens) == piece and offsets[0] == out.index(piece), pieces
            else:
                r = await client.completions.create(model=MODEL, prompt=text, max_tokens=32, stop=["</calc>"],
                                                    logprobs=1)
                out = r.choices[0].text
                assert len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens
                lps.extend(r.choices[0].logprobs.token_logprobs)
            text += out
            m = re.search(r"<calc>(\d+-\d+)$", out)  # the stop string is not in the text (OpenAI's rule)
            value = calculator(m.group(1), left) if m else None
            if value is None:
                return None
            left = int(value)
            text += f"={value}\n"
        return None
    finally:
        await client.close()


async def streaming_completions_agent(base_url, api_key, session_id, record):
    return await completions_agent(base_url, api_key, session_id, record, stream=True)


SAID: dict[str, list] = {}  # session id -> per call (content deltas, tool calls, finish reason), for the test to read
SAID_SEEN: list[str] = []  # content deltas received so far (a gated test engine waits for the first)
# session id -> per call, per answer chunk that held log-probs: (its content, [(token, logprob), ...])
SAID_LOGPROBS: dict[str, list] = {}


async def talking_agent(base_url: str, api_key: str, session_id: str, record: dict, *, stream: bool = True,
                        http_client=None, logprobs: bool = False) -> float | None:
    """Two calls with the calculator tool, streamed or not; records what each call's answer held."""
    from openai import AsyncOpenAI

    def lps(content, lp) -> tuple[str, list]:
        return content or "", [(x.token, x.logprob) for x in lp.content or []]

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http_client)
    messages: list[dict] = [{"role": "user", "content": record["prompt"]}]
    said = SAID.setdefault(session_id, [])
    said_lp = SAID_LOGPROBS.setdefault(session_id, [])
    extra = {"logprobs": True} if logprobs else {}
    try:
        for _ in range(2):
            deltas, calls, finish = [], [], None
            said_lp.append([])
            if stream:
                events = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL],
                                                              stream=True, stream_options={"include_usage": True},
                                                              **extra)
                async for chunk in events:
                    for ch in chunk.choices:
                        if ch.delta.content:
                            deltas.append(ch.delta.content)
                            SAID_SEEN.append(ch.delta.content)
                        if ch.logprobs is not None:
                            said_lp[-1].append(lps(ch.delta.content, ch.logprobs))
                        calls += [(c.id, c.function.name, c.function.arguments) for c in ch.delta.tool_calls or []]
                        finish = ch.finish_reason or finish
            else:
                r = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL], **extra)
                m, finish = r.choices[0].message, r.choices[0].finish_reason
                if r.choices[0].logprobs is not None:
                    said_lp[-1].append(lps(m.content, r.choices[0].logprobs))
                deltas = [m.content] if m.content else []
                calls = [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
            said.append((deltas, calls, finish))
            msg: dict = {"role": "assistant", "content": "".join(deltas) or None}
            if calls:
                msg["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, n, a in calls]
            messages.append(msg)
            if not calls:
                return None
            messages.append({"role": "tool", "tool_call_id": calls[0][0], "content": "0005"})
        return None
    finally:
        await client.close()


async def talking_agent_in_process(base_url, api_key, session_id, record, http_client=None):
    return await talking_agent(base_url, api_key, session_id, record, http_client=http_client)


async def talking_agent_socket(base_url, api_key, session_id, record):
    return await talking_agent(base_url, api_key, session_id, record)


async def talking_agent_plain(base_url, api_key, session_id, record, http_client=None):
    return await talking_agent(base_url, api_key, session_id, record, stream=False, http_client=http_client)


async def talking_agent_logprobs(base_url, api_key, session_id, record, http_client=None):
    return await talking_agent(base_url, api_key, session_id, record, http_client=http_client, logprobs=True)


async def talking_agent_plain_logprobs(base_url, api_key, session_id, record, http_client=None):
    return await talking_agent(base_url, api_key, session_id, record, stream=False, http_client=http_client,
                               logprobs=True)


TEMPLATE_CALLS: dict[str, list[list[dict]]] = {}  # session id -> the messages of each call, in order


async def template_agent(base_url: str, api_key: str, session_id: str, record: dict, http_client=None) -> float:
    """The calculator with a system prompt on a real checkpoint's chat template: it counts down until
    the model answers without a tool call, then asks once more (a second user query: Qwen3's template
    then drops the reasoning of the turns before it). Leaves the messages of every call behind."""
    import copy

    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http_client)
    messages: list[dict] = [{"role": "system", "content": "You count down to zero with the calculator tool."},
                            {"role": "user", "content": record["prompt"]}]
    left, follow_up = int(record["reference"]["total"]), "Count again, from 4."
    calls = TEMPLATE_CALLS.setdefault(session_id, [])
    try:
        for _ in range(8):
            calls.append(copy.deepcopy(messages))
            r = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL])
            msg = r.choices[0].message.model_dump(exclude_none=True)
            messages.append(msg)
            if msg.get("tool_calls"):
                c = msg["tool_calls"][0]
                value = calculator(json.loads(c["function"]["arguments"])["expression"], left) or "0000"
                left = int(value)
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": value})
            elif follow_up is not None:
                messages.append({"role": "user", "content": follow_up})
                follow_up = None
            else:
                break
        return 1.0
    finally:
        await client.close()


async def failing_after_one_call_agent(base_url: str, api_key: str, session_id: str, record: dict,
                                       http_client=None) -> float | None:
    """The calculator agent, except that session g0-s2 raises after its first call: the agent's own
    failure (its sample scores 0 and is trained), never the system's."""
    if session_id.endswith("g0-s2"):
        await calc_agent(base_url, api_key, session_id, record, max_calls=1, http_client=http_client)
        raise RuntimeError("the agent's own bug")
    return await calc_agent(base_url, api_key, session_id, record, http_client=http_client)
