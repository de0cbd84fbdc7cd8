"""The gateway's state: keys, sessions, and how a call becomes a turn of its session's request.

One `Gateway` per run (the HTTP server in seer.rollout.gateway.server serves it); each iteration
opens its sessions (`open_iteration`), G per prompt, one per scheduler request. A session's request
waits for its agent's next call exactly as an `Environment` trajectory waits for its environment
(seer.scheduler.turns): the call's new tokens are the observation, the model's turn is the reply.
Everything runs on the run's one event loop (no locks) but the tokenizing of a long call's text, which
runs in a thread so that it stalls no other session (a call's size is checked before it is tokenized).

Keys: `seer-<session>.<mac>`, an HMAC of the session id under a secret made fresh for the run and
known only to this process. A key names its session and opens nothing else (not the instances, not
another session); a key whose session ended (its iteration is over) is refused with 409, a
malformed or forged one with 401.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from seer.model.chat import ChatFormat, ChatFormatError, Reply
from seer.rollout.gateway.config import GatewayConfig  # noqa: F401  (re-exported)
from seer.rollout.gateway.paths import Leaf, Plan, SessionPath, template_tail
from seer.scheduler.buffer import Request, RequestStatus
from seer.scheduler.turns import StopMatcher, TurnCut, TurnEnd, TurnReply
from seer.types import SamplingParams

log = logging.getLogger(__name__)

# A text this long is tokenized in a thread, off the run's event loop (shorter ones cost less than the hop).
TOKENIZE_INLINE_CHARS = 1024
# Characters a token may stand for beyond its own spelling: a normalizer (NFC) can compose up to
# three characters into one before a token is matched.
NORMALIZE_MARGIN = 4


class ApiError(Exception):
    """An OpenAI-style error: the HTTP status and the `error` object's fields."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GatewayLimits:
    """What one call may ask for, and the bounds on the server's memory."""

    max_request_bytes: int = 4 << 20  # a body past this is refused (413) before it is parsed
    max_call_tokens: int = 2048  # model tokens one call may ask for (rollout.max_tokens)
    max_stop: int = 4  # stop strings per call, as OpenAI allows
    max_context_tokens: int = 4096  # a session's whole context (the model's max_model_len)
    # the most characters one token of the model's vocabulary spells (seer.model.chat.max_token_chars;
    # seer-run sets it from the tokenizer): a text longer than this per token of room is refused before
    # it is tokenized. The default is longer than any real vocabulary's tokens: it refuses nothing wrongly.
    max_token_chars: int = 1024

    def chars_for(self, tokens: int) -> int:
        """The most characters `tokens` tokens can hold: a longer text needs more tokens."""
        return max(0, tokens) * self.max_token_chars * NORMALIZE_MARGIN


@dataclass
class TurnResult:
    """What a call gets back: its model tokens and why the turn ended."""

    ids: list[int]
    logprobs: list[float]
    reason: str  # the TurnEnd's reason: "stop_sequence", "eos", "turn_length", "length", "cancelled"
    prompt_tokens: int
    text: str  # the turn's text, special tokens kept, EOS removed
    reply: Reply | None = None  # chat calls: content and tool calls


@dataclass(eq=False)
class Call:
    """One HTTP call waiting for (or holding) its session's turn."""

    kind: str  # "chat" or "completion"
    text: str  # the conversation rendered (chat) or the prompt (completion)
    max_tokens: int
    stop: tuple[str, ...]  # the agent's stop strings
    format_stop: tuple[str, ...]  # the chat format's (a tool call's end)
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    index: int = -1
    cancelled: bool = False
    gone: Callable[[], Awaitable[bool]] | None = None  # whether its client has disconnected
    matcher: StopMatcher | None = None
    plan: Plan | None = None
    result: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    turn_ids: list[int] = field(default_factory=list)  # the turn's tokens so far, as its chunks return (streaming)
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # set when turn_ids grew
    # where the turn's log-probs start in its request's `logprobs` (they follow turn_ids as its chunks
    # return, so a streamed call can send each delta's log-probs with it)
    lp_at: int = 0


@dataclass(eq=False)
class Session:
    """One agent run: one scheduler request, its path of tokens, and its leaves."""

    id: str
    key: str
    group_id: int
    sample_index: int
    request_id: str
    path: SessionPath = field(default_factory=SessionPath)
    request: Request | None = None
    pending: Call | None = None  # arrived, not yet taken by its request
    call: Call | None = None  # taken: its turn is running
    calls: int = 0
    leaves: list[Leaf] = field(default_factory=list)
    agent_done: bool = False
    ended: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    errors: list[str] = field(default_factory=list)

    def busy(self) -> bool:
        return self.pending is not None or self.call is not None


class Gateway:
    """The run's gateway state (the server and the rollout function share it)."""

    def __init__(self, fmt: ChatFormat, encode: Callable[[str], list[int]], decode_all: Callable[[list[int]], str],
                 decode: Callable[[list[int]], str], eos_text: str, model_name: str, limits: GatewayLimits,
                 abort: Callable[[Request], Any] | None = None) -> None:
        self.fmt, self.encode, self.decode_all, self.decode = fmt, encode, decode_all, decode
        self.eos_text, self.model_name, self.limits = eos_text, model_name, limits
        self.abort = abort  # stops a request's chunk in flight (the rollout sets it per iteration)
        self._secret = secrets.token_bytes(32)  # never leaves this process
        self.sessions: dict[str, Session] = {}
        self.by_request: dict[str, Session] = {}
        self.sampling: SamplingParams | None = None
        self.iteration: int | None = None
        self.base_url = ""
        # An httpx transport to the server's handler in this process (GatewayServer sets it), for
        # agents on this event loop: no socket, no HTTP parsing.
        self.in_process: Callable[[], Any] | None = None
        # in_process: requests that came through the in-process transport (no socket)
        self.counters = {"calls": 0, "errors": 0, "unauthorized": 0, "cancelled": 0, "branches": 0, "in_process": 0,
                         "template_unaligned": 0}

    # ---- keys and sessions -----------------------------------------------------------------------
    def _mac(self, session_id: str) -> str:
        return hmac.new(self._secret, session_id.encode(), hashlib.sha256).hexdigest()[:32]

    def key_for(self, session_id: str) -> str:
        return f"seer-{session_id}.{self._mac(session_id)}"

    def session_of(self, authorization: str | None) -> Session:
        """The session a request's bearer key names (401 without a valid key, 409 once it ended)."""
        token = (authorization or "").removeprefix("Bearer ").strip()
        sid, _, mac = token.removeprefix("seer-").rpartition(".")
        if not token.isascii() or not token.startswith("seer-") or not sid \
                or not hmac.compare_digest(mac, self._mac(sid)):  # (compare_digest takes ASCII text only)
            self.counters["unauthorized"] += 1
            raise ApiError(401, "a valid gateway key is required (Authorization: Bearer <the session's key>)",
                           "invalid_request_error", "invalid_api_key")
        s = self.sessions.get(sid)
        if s is None or s.ended:
            raise ApiError(409, f"session {sid} has ended: its iteration is over, or its agent finished "
                                "(calls are strictly on-policy)", "invalid_request_error", "session_ended")
        return s

    def open_iteration(self, iteration: int, sampling: SamplingParams, sessions: list[tuple[int, int, str]]) -> None:
        """The iteration's sessions: (group, sample index, request id) each; the last iteration's end."""
        self.close_iteration()
        self.iteration, self.sampling = iteration, sampling
        for gid, k, rid in sessions:
            sid = f"it{iteration}-g{gid}-s{k}"
            s = Session(sid, self.key_for(sid), gid, k, rid)
            self.sessions[sid] = s
            self.by_request[rid] = s

    def close_iteration(self) -> None:
        """Refuse every call of the sessions open so far (their iteration is over)."""
        for s in self.sessions.values():
            s.ended = True
            for c in (s.pending, s.call):
                if c is not None and not c.result.done():
                    c.result.set_exception(ApiError(409, "the iteration ended before this call's turn",
                                                    code="session_ended"))
        self.sessions, self.by_request = {}, {}

    # ---- calls (the server's side) ---------------------------------------------------------------
    def check_sampling(self, body: dict) -> None:
        """Refuse what would change the distribution the trainer assumes; see docs/agents-gateway.md."""
        sp = self.sampling or SamplingParams()
        run = {"temperature": sp.temperature, "top_p": sp.top_p}
        for name, value in run.items():
            got = body.get(name)
            if got is not None and (not isinstance(got, (int, float)) or abs(float(got) - value) > 1e-9):
                raise ApiError(400, f"{name}={got!r} differs from the run's {name} ({value}): the trainer assumes "
                                    f"the run's sampling; omit it or send {value}", param=name)
        if body.get("top_k") not in (None, sp.top_k):
            raise ApiError(400, f"top_k differs from the run's ({sp.top_k})", param="top_k")
        if body.get("n") not in (None, 1):
            raise ApiError(400, "n > 1 is not supported: run G sessions instead (each its own agent)", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if body.get(name) not in (None, 0, 0.0):
                raise ApiError(400, f"{name} would change the sampling distribution the trainer assumes", param=name)
        for name in ("logit_bias", "seed", "best_of", "min_p", "repetition_penalty"):
            if body.get(name) not in (None, {}):
                raise ApiError(400, f"{name} is set by the run, not by a call", param=name)
        if body.get("top_logprobs") not in (None, 0):
            raise ApiError(400, "top_logprobs is not served: each token carries its own log-prob only",
                           param="top_logprobs")

    def call_limits(self, body: dict) -> tuple[int, tuple[str, ...]]:
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        cap = self.limits.max_call_tokens
        if mt is None:
            mt = cap
        if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= cap:
            raise ApiError(400, f"max_tokens must be an integer in 1..{cap} (rollout.max_tokens)", param="max_tokens")
        stop = body.get("stop")
        stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop) \
                or len(stop) > self.limits.max_stop:
            raise ApiError(400, f"stop must be a non-empty string or a list of at most {self.limits.max_stop}",
                           param="stop")
        return mt, tuple(stop)

    def check_size(self, text: str) -> None:
        """Refuse (400) a call whose text no context of the model can hold, before anything tokenizes it."""
        lim = self.limits
        if len(text) > lim.chars_for(lim.max_context_tokens):
            raise ApiError(400, f"this call's text is {len(text)} characters: more than the model's context of "
                                f"{lim.max_context_tokens} tokens can hold ({lim.chars_for(lim.max_context_tokens)} "
                                "characters at most); refused before tokenizing",
                           code="context_length_exceeded", param="messages")

    async def submit(self, s: Session, call: Call) -> None:
        for old in (s.pending, s.call):  # an agent that timed out and retried at once: its old call is gone
            if old is not None and old.gone is not None and not old.cancelled and await old.gone():
                self.cancel(s, old)
        if s.busy() and not (s.call is not None and s.call.cancelled and s.pending is None):
            raise ApiError(409, f"session {s.id} already has a call in progress: a session's calls are sequential",
                           code="session_busy")
        call.index = s.calls
        s.calls += 1
        self.counters["calls"] += 1
        s.pending = call
        s.wake.set()

    def cancel(self, s: Session, call: Call) -> None:
        """The client went away: its turn stops at once (its chunk in flight is aborted)."""
        if call.result.done() or call.cancelled:
            return
        call.cancelled = True
        self.counters["cancelled"] += 1
        if s.pending is call:
            s.pending = None
            call.result.cancel()
            return
        r = s.request
        if s.call is call and r is not None and r.status is RequestStatus.RUNNING and self.abort is not None:
            asyncio.ensure_future(self.abort(r))

    # ---- turns (the rollout's side) --------------------------------------------------------------
    async def on_turn_end(self, end: TurnEnd, start_agent: Callable[[Session], None]) -> TurnReply:
        """The driver's turn callback (it must not raise): a fault of ours ends only this session."""
        try:
            return await self._on_turn_end(end, start_agent)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("gateway: session of %s", end.request.request_id)
            s = self.by_request.get(end.request.request_id)
            if s is not None:
                s.ended = True
                s.errors.append(f"gateway error: {e!r}")
                for c in (s.pending, s.call):
                    if c is not None and not c.result.done():
                        c.result.set_exception(ApiError(500, f"internal gateway error: {e!r}", "server_error"))
            return TurnReply(done=True, finish_reason="error")

    async def _on_turn_end(self, end: TurnEnd, start_agent: Callable[[Session], None]) -> TurnReply:
        """Deliver the turn to its call, then wait for the session's next call (or its agent's end)."""
        s = self.by_request[end.request.request_id]
        s.request = end.request
        if end.turn == 0:
            start_agent(s)
        elif s.call is not None:
            self._deliver(s, end)
        if end.reason == "length":  # the session's whole budget is spent
            s.ended = True
            return TurnReply(done=True, finish_reason="length")
        while True:
            call = await self._next_call(s)
            if call is None:
                s.ended = True
                back = s.path.delivered if len(s.path.ids) > s.path.delivered else None
                if back is not None:
                    s.path.rewind(back)
                return TurnReply(done=True, rewind_to=back)
            try:
                reply = await self._take(s, call)
            except ApiError as e:
                reply = None
                if not call.result.done():
                    call.result.set_exception(e)
            except Exception as e:  # the tokenizer or format failed on this call: refuse it, keep the session
                reply = None
                log.exception("gateway: call %d of %s", call.index, s.id)
                if not call.result.done():
                    call.result.set_exception(ApiError(400, f"cannot tokenize this call: {e!r}"))
            if reply is not None:
                return reply
            if s.call is call:
                s.call = None

    async def _next_call(self, s: Session) -> Call | None:
        while True:
            if s.pending is not None:
                call, s.pending = s.pending, None
                if not call.cancelled:
                    return call
                continue
            if s.agent_done or s.ended:
                return None
            s.wake.clear()
            await s.wake.wait()

    async def _take(self, s: Session, call: Call) -> TurnReply | None:
        """The call's turn: its new tokens (None: it went away while they were being tokenized)."""
        s.call = call  # taken: the session is busy while its text is tokenized
        point, new_text = s.path.match(call.text)
        lim = self.limits.max_context_tokens
        room = lim - point.at - call.max_tokens
        if room < 0 or len(new_text) > self.limits.chars_for(room):
            raise ApiError(400, f"this call adds {len(new_text)} characters to the session's {point.at} tokens and "
                                f"asks for {call.max_tokens} more; the model's context is {lim} tokens "
                                f"(refused before tokenizing)", code="context_length_exceeded", param="messages")
        if len(new_text) > TOKENIZE_INLINE_CHARS:  # not on the run's loop: every session and the dispatcher wait there
            new_ids = await asyncio.to_thread(self.encode, new_text)
            if call.cancelled or call.result.done() or s.ended:
                return None
        else:
            new_ids = self.encode(new_text) if new_text else []
        plan = s.path.plan(point, new_ids)
        if plan.context_tokens + call.max_tokens > lim:
            raise ApiError(400, f"this call's context is {plan.context_tokens} tokens and it asks for "
                                f"{call.max_tokens} more; the model's context is {lim} tokens",
                           code="context_length_exceeded", param="messages")
        if plan.leaf is not None:
            s.leaves.append(plan.leaf)
        if plan.rewind_to is not None:
            self.counters["branches"] += 1
        s.path.apply(plan, call.text, call.index)
        call.plan = plan
        call.matcher = StopMatcher((*call.format_stop, *call.stop), self.decode, call.max_tokens)
        return TurnReply(plan.new_ids, rewind_to=plan.rewind_to)

    def _deliver(self, s: Session, end: TurnEnd) -> None:
        call, s.call = s.call, None
        ids = list(end.token_ids)
        req = end.request
        lps = list(req.logprobs[len(req.logprobs) - len(ids):]) if ids else []
        s.path.add_turn(ids, lps)
        if call.cancelled or call.result.done():
            return
        turn = self.decode_all(ids)
        text = turn
        if self.eos_text and text.endswith(self.eos_text):
            text = text[: -len(self.eos_text)]
        shown = text
        for st in call.stop:  # the agent's own stop strings are not part of the reply (OpenAI's rule); the
            if end.reason == "stop_sequence" and shown.endswith(st):  # tokens keep them: the model wrote them
                shown = shown[: -len(st)]
                break
        result = TurnResult(ids, lps, end.reason, call.plan.context_tokens if call.plan else 0, shown)
        if call.kind == "chat":
            try:
                result.reply = self.fmt.parse(shown, call.tools)
            except Exception as e:  # a tool call the parser cannot read: returned as plain content
                log.warning("gateway: parsing a reply of %s failed: %r", s.id, e)
                result.reply = Reply(shown)
            try:
                after = self.fmt.render([*call.messages, result.reply.message()], call.tools, False)
            except ChatFormatError:
                after = None
            if after is not None:
                # what the template writes after the turn (Qwen's "\n" after <|im_end|>) goes to the
                # next call's tokens: the context it continues from is the template's
                tail = template_tail(call.text, turn, shown, after, self.eos_text)
                if tail is None:
                    self.counters["template_unaligned"] += 1
                s.path.deliver(after, call.index, tail or "")
            else:
                s.path.delivered = len(s.path.ids)
        else:
            s.path.deliver(call.text + shown, call.index)
        call.result.set_result(result)

    def agent_finished(self, s: Session) -> None:
        s.agent_done = True
        s.wake.set()


class GatewayTurns:
    """The scheduler's TurnSplitter for gateway sessions: each request's current call decides."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def _call(self, request_id: str) -> Call | None:
        s = self.gw.by_request.get(request_id)
        return s.call if s is not None else None

    def stop_for(self, request_id: str) -> tuple[str, ...]:
        c = self._call(request_id)
        return () if c is None else (*c.format_stop, *c.stop)

    def turn_limit(self, request_id: str) -> int | None:
        c = self._call(request_id)
        return None if c is None else c.max_tokens

    def cut(self, turn_ids, new_ids, finish_reason: str, request_id: str = "") -> TurnCut | None:
        c = self._call(request_id)
        if c is None or c.cancelled:
            return TurnCut(0, "cancelled")
        cut = c.matcher.cut(turn_ids, new_ids, finish_reason)
        keep = len(new_ids) if cut is None else cut.keep
        r = self.gw.by_request[request_id].request
        if r is not None:  # the dispatcher keeps no more than the trajectory's budget
            keep = max(0, min(keep, r.max_tokens - r.generated))
            c.lp_at = len(r.logprobs) - len(turn_ids)  # the dispatcher appends the kept tokens' after this cut
        c.turn_ids = [*turn_ids, *new_ids[:keep]]  # the chunk's tokens stream out now (server.Partial)
        c.progress.set()
        return cut
