"""A stand-in for the gateway where the gateway is not the thing measured or tested: a tiny
OpenAI-compatible server whose "model" plays the calculator task by rule (the agent runner's
tests, tests/agent/, and bench.agent_runner_cost; the real gateway is tested on real instances).

It runs on its own thread and event loop (`Server`), so agents on the caller's loop, in forked
processes and in programs reach it alike; `serve_in_process` runs it in a process of its own, so
that its work does not share the measured process's interpreter. Each call's key must be one the test issued (else 401); every call is kept
(`calls`) with the session its key names; `hold_s` keeps each call open that long, and
`peak_in_flight` is the most calls it ever held at once.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field

from aiohttp import web

MODEL = "seer-standin"


@dataclass
class Call:
    session: str
    body: dict


@dataclass
class StandIn:
    keys: dict[str, str] = field(default_factory=dict)  # api key -> session id
    slip_after: dict[str, int] = field(default_factory=dict)  # session -> calls after which it subtracts 10
    hold_s: float = 0.0
    calls: list[Call] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0

    def key_for(self, session: str) -> str:
        key = f"sk-{session}-{len(self.keys)}"
        self.keys[key] = session
        return key

    def conversation(self, session: str) -> list[list[dict]]:
        return [c.body["messages"] for c in self.calls if c.session == session]

    # ---- the "model" ----

    def reply(self, session: str, messages: list[dict]) -> dict:
        m = re.search(r"start=(\d+)", messages[0]["content"])
        width, left = len(m.group(1)), int(m.group(1))
        tools = [x for x in messages if x["role"] == "tool"]
        if tools:
            left = int(tools[-1]["content"])
        if left == 0:
            return {"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}
        calls = sum(1 for x in messages if x["role"] == "assistant")
        d = 10 if calls >= self.slip_after.get(session, 1 << 30) else min(9, left)
        call = {"id": f"call_{session}_{calls}", "type": "function",
                "function": {"name": "calc", "arguments": json.dumps({"expression": f"{left:0{width}d}-{d}"})}}
        return {"message": {"role": "assistant", "content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}

    # ---- HTTP ----

    async def chat(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        session = self.keys.get(auth.removeprefix("Bearer "))
        if session is None:
            return web.json_response({"error": {"message": "invalid key", "type": "invalid_request_error",
                                                "code": "invalid_api_key"}}, status=401)
        body = await request.json()
        if body.get("model") != MODEL:
            return web.json_response({"error": {"message": f"model {body.get('model')!r} does not exist",
                                                "type": "invalid_request_error", "code": "model_not_found"}},
                                     status=404)
        self.calls.append(Call(session, body))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.hold_s)
        finally:
            self.in_flight -= 1
        choice = {"index": 0, "logprobs": None, **self.reply(session, body["messages"])}
        return web.json_response({"id": f"chatcmpl-{len(self.calls)}", "object": "chat.completion",
                                  "created": int(time.time()), "model": MODEL, "choices": [choice],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "seer"}]})


class Server:
    """`StandIn` served on 127.0.0.1 (an ephemeral port) until close()."""

    def __init__(self, standin: StandIn) -> None:
        self.standin = standin
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("the stand-in server did not start")
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.standin.chat)
        app.router.add_get("/v1/models", self.standin.models)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    def close(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def _serve_forever(conn, keys: dict[str, str], hold_s: float) -> None:
    server = Server(StandIn(keys=keys, hold_s=hold_s))
    conn.send(server.base_url)
    conn.recv()  # until the parent says stop (or dies: EOFError)


def serve_in_process(keys: dict[str, str], hold_s: float = 0.0):
    """A `StandIn` accepting `keys` in a spawned process: (its base URL, a function that stops it)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_forever, args=(child, keys, hold_s), daemon=True)
    proc.start()
    base_url = parent.recv()

    def stop() -> None:
        parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()

    return base_url, stop
