"""The gateway's OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models.

It runs on the run's event loop (uvicorn as a task beside the rollout), bound to the driver's cluster
address, so a call becomes a turn without crossing a thread. Every answer that is not a completion is
an OpenAI-style error object (`{"error": {"message", "type", "param", "code"}}`) with its HTTP status:
400 bad input, 401 no valid key, 404 unknown model or route, 409 a session that ended or is busy,
413 a body past `gateway.max_request_bytes`. Nothing a client sends can end a session or the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request  # module level: the handlers' annotations resolve here

from seer.model.chat import ChatFormatError, Reply, text_of
from seer.rollout.gateway.core import ApiError, Call, Gateway, Session, TurnResult

log = logging.getLogger(__name__)


def _error(e: ApiError):
    from fastapi.responses import JSONResponse

    return JSONResponse(e.body(), status_code=e.status)


def build_app(gw: Gateway):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        gw.counters["errors"] += 1
        return _error(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        gw.counters["errors"] += 1
        kind = "not_found" if e.status_code == 404 else None
        return _error(ApiError(e.status_code, str(e.detail), "invalid_request_error", kind))

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception):  # a bug of ours: an error object, never a dead server
        log.exception("gateway: %s %s", request.method, request.url.path)
        gw.counters["errors"] += 1
        return _error(ApiError(500, f"internal gateway error: {e!r}", "server_error"))

    async def read_json(request: Request) -> dict:
        limit = gw.limits.max_request_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            raise ApiError(413, f"request body over {limit} bytes (gateway.max_request_bytes)", code="request_too_large")
        chunks, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise ApiError(413, f"request body over {limit} bytes (gateway.max_request_bytes)",
                               code="request_too_large")
            chunks.append(part)
        try:
            body = json.loads(b"".join(chunks) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        return body

    def check_model(body: dict) -> None:
        if body.get("model") != gw.model_name:
            raise ApiError(404, f"the model {body.get('model')!r} does not exist; this gateway serves "
                                f"{gw.model_name!r}", code="model_not_found", param="model")

    @app.get("/v1/models")
    async def models(request: Request):
        gw.session_of(request.headers.get("authorization"))
        return {"object": "list", "data": [{"id": gw.model_name, "object": "model", "created": 0, "owned_by": "seer"}]}

    async def wait(request: Request, s: Session, call: Call) -> TurnResult:
        """The call's turn; a client that goes away cancels it."""
        try:
            while True:
                done, _ = await asyncio.wait({call.result}, timeout=0.25)
                if done:
                    return call.result.result()
                if await request.is_disconnected():
                    gw.cancel(s, call)
                    raise ApiError(499, "client closed the request", code="client_closed")
        except asyncio.CancelledError:
            gw.cancel(s, call)
            raise

    async def checked_call(request: Request):
        """What every generating route checks first: the session's key, the body, the model, the
        sampling the run fixed, and the call's own limits."""
        s = gw.session_of(request.headers.get("authorization"))
        body = await read_json(request)
        check_model(body)
        gw.check_sampling(body)
        max_tokens, stop = gw.call_limits(body)
        return s, body, max_tokens, stop

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        s, body, max_tokens, stop = await checked_call(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
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
        call = Call("chat", text, max_tokens, stop, format_stop, messages=messages, tools=tools)
        call.gone = request.is_disconnected
        await gw.submit(s, call)
        want_lp = bool(body.get("logprobs"))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_stream_chat(gw, request, s, call, want_lp, usage, wait),
                                     media_type="text/event-stream")
        result = await wait(request, s, call)
        return JSONResponse(chat_response(gw, result, want_lp))

    @app.post("/v1/completions")
    async def completions(request: Request):
        s, body, max_tokens, stop = await checked_call(request)
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
        call = Call("completion", prompt, max_tokens, stop, ())
        call.gone = request.is_disconnected
        await gw.submit(s, call)
        if body.get("stream"):
            return StreamingResponse(_stream_completion(gw, request, s, call, lp is not None, wait),
                                     media_type="text/event-stream")
        result = await wait(request, s, call)
        return JSONResponse(completion_response(gw, result, lp is not None and lp is not False))

    return app


def _finish(result: TurnResult, reply: Reply | None) -> str:
    if reply is not None and reply.tool_calls:
        return "tool_calls"
    return "length" if result.reason in ("turn_length", "length") else "stop"


def _usage(result: TurnResult) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.ids),
            "total_tokens": result.prompt_tokens + len(result.ids)}


def _chat_logprobs(gw: Gateway, result: TurnResult) -> dict:
    out = []
    for tid, lp in zip(result.ids, result.logprobs):
        tok = gw.decode_all([tid])
        out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []})
    return {"content": out}


def chat_response(gw: Gateway, result: TurnResult, logprobs: bool) -> dict:
    reply = result.reply or Reply(result.text)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": gw.model_name,
        "choices": [{"index": 0, "message": reply.message(), "finish_reason": _finish(result, reply),
                     "logprobs": _chat_logprobs(gw, result) if logprobs else None}],
        "usage": _usage(result),
    }


def completion_response(gw: Gateway, result: TurnResult, logprobs: bool) -> dict:
    lp = None
    if logprobs:
        toks = [gw.decode_all([t]) for t in result.ids]
        offsets, at = [], 0
        for t in toks:
            offsets.append(at)
            at += len(t)
        lp = {"tokens": toks, "token_logprobs": list(result.logprobs), "top_logprobs": None, "text_offset": offsets}
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": gw.model_name,
        "choices": [{"index": 0, "text": result.text, "logprobs": lp, "finish_reason": _finish(result, None)}],
        "usage": _usage(result),
    }


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _stream_chat(gw: Gateway, request, s: Session, call: Call, logprobs: bool, usage: bool,
                       wait) -> AsyncIterator[str]:
    """Server-sent events of one turn. The turn is delivered whole when it ends (a turn is generated
    in chunks wherever the scheduler puts them), then the finish and, if asked, the usage."""
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta: dict, finish: str | None = None, lp=None, **extra) -> str:
        return _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": gw.model_name,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lp}], **extra})

    try:
        result = await wait(request, s, call)
    except ApiError as e:
        yield _sse(e.body())
        yield "data: [DONE]\n\n"
        return
    reply = result.reply or Reply(result.text)
    yield chunk({"role": "assistant", "content": ""})
    if reply.content:
        yield chunk({"content": reply.content}, lp=_chat_logprobs(gw, result) if logprobs else None)
    if reply.tool_calls:
        yield chunk({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                     "function": {"name": c.name, "arguments": c.arguments}}
                                    for i, c in enumerate(reply.tool_calls)]})
    yield chunk({}, _finish(result, reply))
    if usage:
        yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": gw.model_name,
                    "choices": [], "usage": _usage(result)})
    yield "data: [DONE]\n\n"


async def _stream_completion(gw: Gateway, request, s: Session, call: Call, logprobs: bool, wait) -> AsyncIterator[str]:
    try:
        result = await wait(request, s, call)
    except ApiError as e:
        yield _sse(e.body())
        yield "data: [DONE]\n\n"
        return
    body = completion_response(gw, result, logprobs)
    body["object"] = "text_completion"
    yield _sse(body)
    yield "data: [DONE]\n\n"


class GatewayServer:
    """uvicorn serving `build_app(gw)` on the run's event loop."""

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
        return self.gw.base_url

    async def close(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)
            self._server = self._task = None


__all__ = ["GatewayServer", "build_app", "chat_response", "completion_response", "text_of"]
