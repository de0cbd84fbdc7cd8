"""The gateway's OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models.

A lean request path, no web framework: `Api.handle` takes one call (its method, path, key, body
reader and a future that completes when its client goes away) and answers it; two doors lead to it.
`build_app` is a plain ASGI app for uvicorn, which runs on the run's event loop bound to the driver's
cluster address (any process's agents reach it). `InProcessTransport` is an httpx transport that
calls `Api.handle` directly, with no socket and no HTTP parsing on either side: agents on the
driver's event loop (`agent.mode: loop`) get an `httpx.AsyncClient` over it (the `http_client`
keyword, docs/agents.md). Measured in bench/results/agent_gateway/: what a call costs is mostly the
client's side (the `openai` client's request building, an SSL context per client), not the server.

Every answer that is not a completion is an OpenAI-style error object (`{"error": {"message",
"type", "param", "code"}}`) with its HTTP status: 400 bad input, 401 no valid key, 404 unknown model
or route, 405 a route's wrong method, 409 a session that ended or is busy, 413 a body past
`gateway.max_request_bytes`. Nothing a client sends can end a session or the run, and a call is
checked whole (every field's type, its size) before it is submitted to its session: a refused call
leaves nothing behind.

Streaming (`stream: true`) sends a turn's text as its chunks return (the scheduler generates a turn
as chunks; `Call.turn_ids` grows with each), holding back what may still become a tool call, a stop
string or EOS; the tool calls, the finish reason and the usage follow when the turn ends. With
`logprobs`, each delta is whole tokens and carries their log-probs (OpenAI's
`choices[0].logprobs.content`); the last delta carries those of the tokens not sent before (a tool
call's, EOS), so that a stream's log-probs are every token of the turn, in order, as a plain call's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from seer.model.chat import ChatFormatError, Reply, text_of
from seer.rollout.gateway.core import ApiError, Call, Gateway, Session, TurnResult

log = logging.getLogger(__name__)
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


# The JSON types each field a call may carry must have (unknown fields are ignored, as vLLM does):
# checked before anything reads the body, so a wrong type is a 400 naming the field.
_COMMON_FIELDS = {
    "model": ("string",), "stream": ("boolean", "null"), "stream_options": ("object", "null"),
    "max_tokens": ("integer", "null"), "stop": ("string", "array", "null"),
    "temperature": ("number", "null"), "top_p": ("number", "null"), "top_k": ("integer", "null"),
    "n": ("integer", "null"), "presence_penalty": ("number", "null"), "frequency_penalty": ("number", "null"),
    "seed": ("integer", "null"), "logit_bias": ("object", "null"), "user": ("string", "null"),
}
CHAT_FIELDS = {**_COMMON_FIELDS, "messages": ("array",), "tools": ("array", "null"),
               "tool_choice": ("string", "object", "null"), "logprobs": ("boolean", "null"),
               "top_logprobs": ("integer", "null"), "max_completion_tokens": ("integer", "null"),
               "response_format": ("object", "null"), "parallel_tool_calls": ("boolean", "null")}
COMPLETION_FIELDS = {**_COMMON_FIELDS, "prompt": ("string", "array"), "logprobs": ("integer", "boolean", "null"),
                     "echo": ("boolean", "null"), "suffix": ("string", "null")}
MESSAGE_FIELDS = {"role": ("string",), "content": ("string", "array", "null"), "name": ("string", "null"),
                  "tool_calls": ("array", "null"), "tool_call_id": ("string", "null")}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def check_fields(obj: dict, spec: dict[str, tuple[str, ...]], where: str = "") -> None:
    """400 for the first field of `obj` whose JSON type `spec` does not allow (an integer is a number)."""
    for name, kinds in spec.items():
        if name not in obj:
            continue
        got = json_type(obj[name])
        if got not in kinds and not (got == "integer" and "number" in kinds):
            raise ApiError(400, f"{where}{name} must be {' or '.join(kinds)}, not {got}", param=f"{where}{name}")


@dataclass
class Incoming:
    """One HTTP call as `Api.handle` sees it, whichever door it came through."""

    method: str
    path: str
    authorization: str | None
    content_length: int | None  # as the client declared it (None: not declared)
    read: Callable[[int], Awaitable[bytes]]  # the body; ApiError 413 past the byte limit it is given
    closed: asyncio.Future  # done once the client has gone away

    async def gone(self) -> bool:
        return self.closed.done()


@dataclass
class Answer:
    status: int
    body: Any = None  # a JSON body, or
    events: AsyncIterator[str] | None = None  # server-sent events


class Api:
    """The routes, as plain async functions of an `Incoming` call."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.routes: dict[str, tuple[str, Callable[[Incoming], Awaitable[Answer]]]] = {
            "/v1/models": ("GET", self.models), "/v1/chat/completions": ("POST", self.chat),
            "/v1/completions": ("POST", self.completions)}

    async def handle(self, inc: Incoming) -> Answer:
        """The call's answer; never raises but for a cancellation."""
        gw = self.gw
        try:
            route = self.routes.get(inc.path.rstrip("/") or "/")
            if route is None:
                raise ApiError(404, "Not Found", code="not_found")
            if inc.method != route[0]:
                raise ApiError(405, "Method Not Allowed", code="method_not_allowed")
            return await route[1](inc)
        except ApiError as e:
            gw.counters["errors"] += 1
            return Answer(e.status, e.body())
        except Exception as e:  # a bug of ours: an error object, never a dead server
            log.exception("gateway: %s %s", inc.method, inc.path)
            gw.counters["errors"] += 1
            return Answer(500, ApiError(500, f"internal gateway error: {e!r}", "server_error").body())

    async def read_json(self, inc: Incoming) -> dict:
        limit = self.gw.limits.max_request_bytes
        if (inc.content_length or 0) > limit:
            raise ApiError(413, f"request body over {limit} bytes (gateway.max_request_bytes)", code="request_too_large")
        data = await inc.read(limit)
        try:
            body = json.loads(data or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
        except RecursionError:
            raise ApiError(400, "the body's JSON is nested too deeply", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        return body

    def check_model(self, body: dict) -> None:
        gw = self.gw
        if body.get("model") != gw.model_name:
            raise ApiError(404, f"the model {body.get('model')!r} does not exist; this gateway serves "
                                f"{gw.model_name!r}", code="model_not_found", param="model")

    async def models(self, inc: Incoming) -> Answer:
        gw = self.gw
        gw.session_of(inc.authorization)
        return Answer(200, {"object": "list", "data": [{"id": gw.model_name, "object": "model", "created": 0,
                                                        "owned_by": "seer"}]})

    async def checked_call(self, inc: Incoming, fields: dict[str, tuple[str, ...]]):
        """What every generating route checks first: the session's key, the body and its fields'
        types, the model, the sampling the run fixed, and the call's own limits."""
        s = self.gw.session_of(inc.authorization)
        body = await self.read_json(inc)
        check_fields(body, fields)
        if body.get("stream_options") is not None:
            check_fields(body["stream_options"], {"include_usage": ("boolean", "null")}, "stream_options.")
        self.check_model(body)
        self.gw.check_sampling(body)
        max_tokens, stop = self.gw.call_limits(body)
        return s, body, max_tokens, stop

    async def chat(self, inc: Incoming) -> Answer:
        gw = self.gw
        s, body, max_tokens, stop = await self.checked_call(inc, CHAT_FIELDS)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
        for i, m in enumerate(messages):
            check_fields(m, MESSAGE_FIELDS, f"messages[{i}].")
        tools = body.get("tools") or None
        choice = body.get("tool_choice")
        if choice == "none":
            tools = None
        elif choice not in (None, "auto"):
            raise ApiError(400, "tool_choice may be 'auto' or 'none' (the model's own choice is what is trained)",
                           param="tool_choice")
        fmt = body.get("response_format")
        if fmt not in (None, {"type": "text"}):
            raise ApiError(400, "response_format other than text is not served", param="response_format")
        try:
            gw.fmt.check_tools(tools)
            text = gw.fmt.render(messages, tools, True)
            format_stop = gw.fmt.stop(tools)
        except ChatFormatError as e:
            raise ApiError(400, str(e), param=e.param or "messages") from None
        gw.check_size(text)
        want_lp = bool(body.get("logprobs"))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        call = Call("chat", text, max_tokens, stop, format_stop, messages=messages, tools=tools)
        call.gone = inc.gone
        await gw.submit(s, call)  # everything is checked: from here the call is its session's
        if body.get("stream"):
            return Answer(200, events=_stream_chat(gw, inc, s, call, want_lp, usage))
        result = await wait(gw, inc, s, call)
        return Answer(200, chat_response(gw, result, want_lp))

    async def completions(self, inc: Incoming) -> Answer:
        gw = self.gw
        s, body, max_tokens, stop = await self.checked_call(inc, COMPLETION_FIELDS)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise ApiError(400, "prompt must be one non-empty string", param="prompt")
        lp = body.get("logprobs")
        if lp not in (None, False, 0, 1, True):
            raise ApiError(400, "logprobs may be 0 or 1: each token carries its own log-prob only", param="logprobs")
        if body.get("echo") or body.get("suffix"):
            raise ApiError(400, "echo and suffix are not served", param="echo")
        gw.check_size(prompt)
        want_lp = lp is not None and lp is not False
        call = Call("completion", prompt, max_tokens, stop, ())
        call.gone = inc.gone
        await gw.submit(s, call)
        if body.get("stream"):
            return Answer(200, events=_stream_completion(gw, inc, s, call, want_lp))
        result = await wait(gw, inc, s, call)
        return Answer(200, completion_response(gw, result, want_lp))


async def wait(gw: Gateway, inc: Incoming, s: Session, call: Call) -> TurnResult:
    """The call's turn; a client that goes away (or a caller cancelled) cancels it."""
    try:
        await asyncio.wait({call.result, inc.closed}, return_when=asyncio.FIRST_COMPLETED)
        if not call.result.done():
            gw.cancel(s, call)
            raise ApiError(499, "client closed the request", code="client_closed")
        return call.result.result()
    except asyncio.CancelledError:
        gw.cancel(s, call)
        raise


def _finish(result: TurnResult, reply: Reply | None) -> str:
    if reply is not None and reply.tool_calls:
        return "tool_calls"
    return "length" if result.reason in ("turn_length", "length") else "stop"


def _usage(result: TurnResult) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.ids),
            "total_tokens": result.prompt_tokens + len(result.ids)}


def _chat_logprobs(gw: Gateway, ids: list[int], logprobs: list[float]) -> dict:
    out = []
    for tid, lp in zip(ids, logprobs):
        tok = gw.decode_all([tid])
        out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []})
    return {"content": out}


def _completion_logprobs(gw: Gateway, ids: list[int], logprobs: list[float], at: int = 0) -> dict:
    """The completions API's log-probs of `ids`, their text starting at offset `at`."""
    toks = [gw.decode_all([t]) for t in ids]
    offsets = []
    for t in toks:
        offsets.append(at)
        at += len(t)
    return {"tokens": toks, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": offsets}


def chat_response(gw: Gateway, result: TurnResult, logprobs: bool) -> dict:
    reply = result.reply or Reply(result.text)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": gw.model_name,
        "choices": [{"index": 0, "message": reply.message(), "finish_reason": _finish(result, reply),
                     "logprobs": _chat_logprobs(gw, result.ids, result.logprobs) if logprobs else None}],
        "usage": _usage(result),
    }


def completion_response(gw: Gateway, result: TurnResult, logprobs: bool) -> dict:
    lp = _completion_logprobs(gw, result.ids, result.logprobs) if logprobs else None
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": gw.model_name,
        "choices": [{"index": 0, "text": result.text, "logprobs": lp, "finish_reason": _finish(result, None)}],
        "usage": _usage(result),
    }


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class Partial:
    """The text of a turn in progress that is safe to send: what no later token can take back. It
    stops before anything that may still become a tool call (the format's `call_starts`), a stop
    string or EOS, and holds back a tail that may begin one, trailing whitespace (a parser may strip
    it) and an incomplete character. `off`: nothing can be sent early (a format whose tool calls have
    no known start). With `logprobs` what goes out is whole tokens, each delta with its tokens'
    log-probs."""

    def __init__(self, gw: Gateway, s: Session, call: Call, logprobs: bool) -> None:
        starts = gw.fmt.call_starts(call.tools) if call.kind == "chat" else ()
        self.gw, self.s, self.call, self.logprobs = gw, s, call, logprobs
        self.off = starts is None
        self.marks = tuple(m for m in (*(starts or ()), *call.stop, *call.format_stop, gw.eos_text) if m)
        self.sent, self.sent_ids = "", 0  # what went out: its text, and (with log-probs) its tokens

    def text(self) -> str:
        if self.off or not self.call.turn_ids:
            return ""
        text = self.gw.decode_all(self.call.turn_ids)
        cut = min((i for i in (text.find(m) for m in self.marks) if i >= 0), default=len(text))
        text = text[:cut]
        for m in self.marks:  # a tail that may be the start of a marker
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    text = text[:-k]
                    break
        return text.rstrip().rstrip("\ufffd")

    def advance(self) -> tuple[str, list[int], list[float]] | None:
        """The next delta, if any: its text and, with log-probs, its tokens and their log-probs (the
        longest run of whole tokens whose text the safe text holds)."""
        text = self.text()
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return None
        if not self.logprobs:
            piece, self.sent = text[len(self.sent):], text
            return piece, [], []
        ids = self.call.turn_ids
        # decode only the unsent tokens after what was sent (a long turn would otherwise decode its
        # whole prefix once per token); one whole decode confirms it, else the exact, slower way
        upto = self._whole_tokens(text, lambda j: self.sent + self.gw.decode_all(ids[self.sent_ids:j]))
        if upto is not None and self.gw.decode_all(ids[:upto[0]]) != upto[1]:
            upto = self._whole_tokens(text, lambda j: self.gw.decode_all(ids[:j]))
        req = self.s.request
        if upto is None or req is None:
            return None
        j, t = upto
        lps = req.logprobs[self.call.lp_at + self.sent_ids:self.call.lp_at + j]
        if len(lps) != j - self.sent_ids:  # not where the turn's cut put them: all of them go at the end
            return None
        out = (t[len(self.sent):], list(ids[self.sent_ids:j]), list(lps))
        self.sent, self.sent_ids = t, j
        return out

    def _whole_tokens(self, text: str, decoded) -> tuple[int, str] | None:
        """The most tokens past those sent whose text (`decoded(j)`: the turn's first j tokens') the
        safe text holds, with that text; None if no more."""
        upto = None
        for j in range(self.sent_ids + 1, len(self.call.turn_ids) + 1):
            t = decoded(j)
            if text.startswith(t):
                upto = (j, t) if len(t) > len(self.sent) else upto
            elif not text.startswith(t.rstrip("\ufffd")):  # past the safe text (not a character still incomplete)
                break
        return upto

    def rest(self, result: TurnResult) -> tuple[list[int], list[float]]:
        """The turn's tokens (and their log-probs) not sent before its end."""
        if list(result.ids[:self.sent_ids]) != list(self.call.turn_ids[:self.sent_ids]):
            log.warning("gateway: a streamed turn's tokens do not continue what was sent early")
        return list(result.ids[self.sent_ids:]), list(result.logprobs[self.sent_ids:])


async def _progress(inc: Incoming, call: Call, partial: Partial) -> AsyncIterator[tuple[str, list[int], list[float]]]:
    """Deltas of the turn as its chunks return (`Partial.advance`), until it ends (then `wait` gives
    its result)."""
    while not call.result.done() and not partial.off:
        call.progress.clear()
        ticked = asyncio.ensure_future(call.progress.wait())
        try:
            await asyncio.wait({call.result, inc.closed, ticked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ticked.cancel()
        if inc.closed.done() or call.result.done():
            return
        delta = partial.advance()
        if delta is not None:
            yield delta


def _rest(final: str, sent: str, where: str) -> str:
    if final.startswith(sent):
        return final[len(sent):]
    log.warning("gateway: a streamed %s's final text does not continue what was sent early", where)
    return ""


async def _stream_chat(gw: Gateway, inc: Incoming, s: Session, call: Call, logprobs: bool,
                       usage: bool) -> AsyncIterator[str]:
    """Server-sent events of one turn: its content as the turn's chunks return, then the rest of
    the reply (its tool calls), the finish and, if asked, the usage."""
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta: dict, finish: str | None = None, lp=None, **extra) -> str:
        return _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": gw.model_name,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lp}], **extra})

    done = False
    try:
        yield chunk({"role": "assistant", "content": ""})
        partial = Partial(gw, s, call, logprobs)
        async for piece, ids, lps in _progress(inc, call, partial):
            yield chunk({"content": piece}, lp=_chat_logprobs(gw, ids, lps) if logprobs else None)
        try:
            result = await wait(gw, inc, s, call)
        except ApiError as e:
            done = True
            yield _sse(e.body())
            yield "data: [DONE]\n\n"
            return
        reply = result.reply or Reply(result.text)
        rest = _rest(reply.content, partial.sent, "reply")
        ids, lps = partial.rest(result)
        if rest or (logprobs and ids):
            yield chunk({"content": rest}, lp=_chat_logprobs(gw, ids, lps) if logprobs else None)
        if reply.tool_calls:
            yield chunk({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                         "function": {"name": c.name, "arguments": c.arguments}}
                                        for i, c in enumerate(reply.tool_calls)]})
        yield chunk({}, _finish(result, reply))
        if usage:
            yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": gw.model_name,
                        "choices": [], "usage": _usage(result)})
        done = True
        yield "data: [DONE]\n\n"
    finally:
        if not done:  # the client stopped reading: its turn stops
            gw.cancel(s, call)


async def _stream_completion(gw: Gateway, inc: Incoming, s: Session, call: Call, logprobs: bool) -> AsyncIterator[str]:
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def piece(text: str, finish: str | None = None, lp=None) -> str:
        return _sse({"id": cid, "object": "text_completion", "created": created, "model": gw.model_name,
                     "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]})

    done = False
    try:
        partial = Partial(gw, s, call, logprobs)
        at = 0
        async for text, ids, lps in _progress(inc, call, partial):
            yield piece(text, lp=_completion_logprobs(gw, ids, lps, at) if logprobs else None)
            at += len(text)
        try:
            result = await wait(gw, inc, s, call)
        except ApiError as e:
            done = True
            yield _sse(e.body())
            yield "data: [DONE]\n\n"
            return
        ids, lps = partial.rest(result)
        yield piece(_rest(result.text, partial.sent, "completion"), _finish(result, None),
                    _completion_logprobs(gw, ids, lps, len(partial.sent)) if logprobs else None)
        done = True
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            gw.cancel(s, call)


# ---- the doors: ASGI for uvicorn, an httpx transport in this process ---------------------------

def build_app(gw: Gateway):
    """A plain ASGI app over `Api` (uvicorn serves it)."""
    api = Api(gw)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":  # uvicorn runs with lifespan off; a server that sends it gets answers
            for kind in ("startup", "shutdown"):
                await receive()
                await send({"type": f"lifespan.{kind}.complete"})
            return
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        closed = asyncio.get_running_loop().create_future()
        watch: asyncio.Task | None = None

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not closed.done():
                closed.set_result(None)

        async def read(limit: int) -> bytes:
            nonlocal watch
            chunks, size = [], 0
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    closed.set_result(None)
                    raise ApiError(499, "client closed the request", code="client_closed")
                part = msg.get("body", b"")
                size += len(part)
                if size > limit:
                    raise ApiError(413, f"request body over {limit} bytes (gateway.max_request_bytes)",
                                   code="request_too_large")
                chunks.append(part)
                if not msg.get("more_body"):
                    break
            watch = asyncio.ensure_future(watch_disconnect())
            return b"".join(chunks)

        length = headers.get(b"content-length")
        auth = headers.get(b"authorization")
        inc = Incoming(scope["method"], scope["path"], auth.decode("latin-1") if auth is not None else None,
                       int(length) if length and length.isdigit() else None, read, closed)
        try:
            ans = await api.handle(inc)
            if ans.events is None:
                data = json.dumps(ans.body).encode()
                await send({"type": "http.response.start", "status": ans.status,
                            "headers": [*JSON_HEADERS, (b"content-length", str(len(data)).encode())]})
                await send({"type": "http.response.body", "body": data})
                return
            await send({"type": "http.response.start", "status": ans.status, "headers": SSE_HEADERS})
            try:
                async for event in ans.events:
                    if closed.done():
                        break
                    await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            finally:
                await ans.events.aclose()
            if not closed.done():
                await send({"type": "http.response.body", "body": b""})
        finally:
            if watch is not None:
                watch.cancel()

    return app


def in_process_transport(api: Api):
    """An httpx transport that hands each request to `api` in the caller's task: no socket, no HTTP
    parsing. A read timeout the client sets cancels the call, as a client that goes away would."""
    import httpx

    class Events(httpx.AsyncByteStream):
        """A streamed answer's events; closing it is the client going away."""

        def __init__(self, events: AsyncIterator[str], closed: asyncio.Future) -> None:
            self.events, self.closed = events, closed

        async def __aiter__(self):
            async for event in self.events:
                yield event.encode()

        async def aclose(self) -> None:
            if not self.closed.done():
                self.closed.set_result(None)
            await self.events.aclose()

    class InProcessTransport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            content = await request.aread()
            closed = asyncio.get_running_loop().create_future()

            async def read(limit: int) -> bytes:
                if len(content) > limit:
                    raise ApiError(413, f"request body over {limit} bytes (gateway.max_request_bytes)",
                                   code="request_too_large")
                return content

            inc = Incoming(request.method, request.url.path, request.headers.get("authorization"), len(content),
                           read, closed)
            api.gw.counters["in_process"] += 1
            timeout = (request.extensions.get("timeout") or {}).get("read")
            try:  # a timeout cancels the call's turn (Api.handle's `wait` does)
                async with asyncio.timeout(timeout):
                    ans = await api.handle(inc)
            except TimeoutError:
                raise httpx.ReadTimeout("the gateway's answer took longer than the client's read timeout",
                                        request=request) from None
            if ans.events is None:
                return httpx.Response(ans.status, headers=JSON_HEADERS, content=json.dumps(ans.body).encode(),
                                      request=request)
            return httpx.Response(ans.status, headers=SSE_HEADERS, stream=Events(ans.events, closed), request=request)

    return InProcessTransport()


class GatewayServer:
    """uvicorn serving `build_app(gw)` on the run's event loop; also sets `gw.in_process`."""

    def __init__(self, gw: Gateway, host: str, port: int | None = None) -> None:
        self.gw, self.host, self.port = gw, host, port
        self._server = None
        self._task: asyncio.Task | None = None

    async def start(self) -> str:
        import uvicorn

        config = uvicorn.Config(build_app(self.gw), host=self.host, port=self.port or 0, log_level="warning",
                                lifespan="off", access_log=False, limit_concurrency=4096,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._server.capture_signals = contextlib.nullcontext  # the run owns its signals (Ctrl-C, SIGTERM)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not bind
                raise RuntimeError("the gateway server stopped while starting")
            await asyncio.sleep(0.02)
        sock = self._server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        self.port = port
        self.gw.base_url = f"http://{host}:{port}/v1"
        api = Api(self.gw)
        self.gw.in_process = lambda: in_process_transport(api)
        return self.gw.base_url

    async def close(self) -> None:
        self.gw.in_process = None
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)
            self._server = self._task = None


__all__ = ["Api", "GatewayServer", "build_app", "chat_response", "completion_response", "in_process_transport",
           "text_of"]
