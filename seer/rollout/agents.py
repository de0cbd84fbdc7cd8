"""The agent as a plug point: `task.agent` names a program that talks to the gateway, and this
module runs it once per session, contained (docs/agents.md).

An agent is either
- a `module:function` path: `async def agent(base_url, api_key, session_id, record,
  **task.agent_args)` (and `model`, the served model's name, if it takes one), returning its reward
  (a number) or None (the task's reward function scores the session's final transcript); or
- a command line, run once per session with OPENAI_BASE_URL, OPENAI_API_KEY, SEER_SESSION_ID,
  SEER_MODEL, SEER_RECORD (the record as JSON) and SEER_REWARD_FILE (where it may write its reward)
  in its environment.

The record is the task record: {"prompt": its text, "reference": the reference the reward function
gets, ...}.

Agents are user code: one that crashes, hangs, calls sys.exit, raises KeyboardInterrupt or kills
its own process costs only its session, which ends after at most `agent.timeout_s` with reward 0
and the error recorded; nothing it raises reaches the rollout. With `agent.mode: process` (the
default) every session runs in its own process, forked from one agent host per run
(seer.rollout.agent_host) that starts with an allow-listed environment (no run secret), and the
session's whole process group is killed when it ends; `agent.mode: loop` runs function agents on the
driver's event loop instead (cheaper, but an agent that blocks stalls the rollout). At most
`agent.max_concurrent` sessions run at once on a node.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from seer.plugins import PluginError, check_arguments, resolve
from seer.procs.contain import HIDE_ENV, contained_argv, hidden_paths
from seer.procs.environment import agent_inherited
from seer.rollout.agent_host import (HTTP_CLIENT_KEYWORD, HTTP_TIMEOUT_S, MAX_DRIVER_FRAME_BYTES, MAX_HOST_FRAME_BYTES,
                                     MAX_ID_BYTES, RESULT_SHAPE, FrameError, FrameReader, bound_text, call_agent,
                                     check_shape, error_line, frame, http_client, json_size)
from seer.tasks.workers import BOUNDS

AGENT_KEYWORDS = ("base_url", "api_key", "session_id", "record")  # what every function agent is given, by name
MODEL_KEYWORD = "model"  # given too when the agent takes it: the name of the model the gateway serves
# HTTP_CLIENT_KEYWORD (agent_host): given too when the agent takes a parameter of that name: with
# `agent.mode: loop`, an httpx.AsyncClient that calls the gateway's handler in this process (no socket,
# no HTTP parsing), to pass to its client (AsyncOpenAI(http_client=...)); in process mode an ordinary
# client whose SSL context the agent host made once before it forked (agent_host.http_client).
MAX_RECORD_ENV_BYTES = 100_000  # SEER_RECORD must fit one environment string (Linux: 128 KiB)
HOST_START_S = BOUNDS.env_init_s  # the host's start (it imports the agent's module) is not a session's time
_FUNCTION_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
HOST_TRIES = 3  # hosts a session is offered to before it fails (a retiring host refuses sessions)
log = logging.getLogger(__name__)


class AgentSpecError(PluginError):
    """A `task.agent` that names no usable agent; the message names the key."""


@dataclass(frozen=True)
class AgentConfig:
    """How agents run (used when `task.agent` is set)."""

    # One session's bound, from its start to its agent's end, model calls included (null: none).
    # Past it the agent is killed, and the session scores 0 with the error recorded.
    timeout_s: float | None = 900.0
    max_concurrent: int = 64  # agent sessions running at once on a node; more wait for a slot
    # Where function agents run: own processes without the run's secrets, or the driver's event loop.
    # "process": each session forked from one agent host (contained); "loop": cheaper, but an agent
    # that blocks stalls the rollout. Command agents always run as processes.
    mode: Literal["process", "loop"] = "process"
    # More of seer-run's environment variables an agent may see (its tools' keys), by name. Otherwise
    # an agent sees only the basics (PATH, HOME, locale, Python's) and its session's variables.
    inherit_env: tuple[str, ...] = ()
    # A command agent that serves many sessions from one process (it pays its start once): started
    # once per run, it reads session frames on its stdin and answers each on its stdout (docs/agents.md).
    serve: bool = False

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if self.timeout_s is not None and not self.timeout_s > 0:
            out.append(("agent.timeout_s", f"must be > 0 (or null: no limit), got {self.timeout_s}"))
        if self.max_concurrent < 1:
            out.append(("agent.max_concurrent", f"must be >= 1, got {self.max_concurrent}"))
        bad = [n for n in self.inherit_env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
        if bad:
            out.append(("agent.inherit_env", f"not environment variable names: {bad}"))
        return out


@dataclass(frozen=True)
class AgentSpec:
    """An agent as `task.agent` names it: "module:function" or a command line."""

    target: str
    kind: str  # "function" | "command"
    timeout_s: float | None  # agent.timeout_s (None: no limit)
    args: tuple[tuple[str, Any], ...] = ()  # task.agent_args (function agents' extra keywords)
    mode: str = AgentConfig.mode  # agent.mode
    inherit_env: tuple[str, ...] = ()  # agent.inherit_env
    serve: bool = AgentConfig.serve  # agent.serve (command agents only)

    @classmethod
    def parse(cls, value: str, timeout_s: float | None, *, args: dict | None = None,
              cfg: AgentConfig | None = None) -> "AgentSpec":
        """`task.agent` read and checked: a function path (resolved: an async function taking the
        agent keywords and `args`) or a command line (its program found on PATH)."""
        if not isinstance(value, str) or not value.strip():
            raise AgentSpecError("task.agent must be 'package.module:function' or a command line")
        cfg = cfg or AgentConfig(timeout_s=timeout_s)
        extra = tuple(sorted((args or {}).items()))
        if _FUNCTION_PATH.fullmatch(value.strip()):
            if cfg.serve:
                raise AgentSpecError("agent.serve: only a command-line agent serves sessions (a function agent's "
                                     "sessions are forks of one host that imported it already)")
            resolve_agent(value.strip(), args)
            return cls(value.strip(), "function", timeout_s, extra, cfg.mode, tuple(cfg.inherit_env))
        if args:
            raise AgentSpecError("task.agent_args: a command-line agent takes no keyword arguments (put them "
                                 "on its command line)")
        try:
            argv = shlex.split(value)
        except ValueError as e:
            raise AgentSpecError(f"task.agent {value!r}: not a command line ({e})") from None
        if shutil.which(argv[0]) is None:
            raise AgentSpecError(f"task.agent {value!r}: {argv[0]!r} is not an executable on PATH (nor a "
                                 "'package.module:function' path)")
        return cls(value, "command", timeout_s, (), cfg.mode, tuple(cfg.inherit_env), bool(cfg.serve))

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.target)


def takes_http_client(fn: Any) -> bool:
    """Whether a function agent takes `http_client` (by that name: an agent opts in)."""
    return HTTP_CLIENT_KEYWORD in inspect.signature(fn).parameters


def takes_model(fn: Any) -> bool:
    """Whether a function agent takes `model` (a parameter of that name, or **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name == MODEL_KEYWORD or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def resolve_agent(path: str, args: dict | None = None) -> Any:
    """The `task.agent` function, checked to be async and to take the agent keywords and `args`."""
    fn = resolve(path, key="task.agent", kind=inspect.iscoroutinefunction, kind_name="coroutine function (async def)",
                 error=AgentSpecError)
    try:
        check_arguments(fn, args or {}, key="task.agent_args", given=dict.fromkeys(AGENT_KEYWORDS, ""),
                        fn_key="task.agent")
    except PluginError as e:
        raise AgentSpecError(str(e)) from None
    return fn


@dataclass(frozen=True)
class AgentSession:
    session_id: str
    base_url: str  # the gateway's /v1 base URL
    api_key: str  # this session's own gateway key
    record: dict  # the task record (prompt text, reference)
    model: str = ""  # the model name the gateway serves (gateway.model_name); "": the agent asks /v1/models
    transport: Any = None  # () -> an httpx transport to the gateway in this process (Gateway.in_process), or None


@dataclass(frozen=True)
class AgentOutcome:
    reward: float | None  # None: leave it to the task's reward function on the final transcript
    error: str | None
    wall_s: float
    log: str | None = None  # the session's stdout and stderr (process mode), kept when the runner has a log_dir
    # The error is Seer's, not the agent's (its host could not start or went away, the session could not
    # be handed to it): the session is no sample of the policy and is not trained (seer.types.FailureKind).
    system: bool = False


def in_loop_client(session: AgentSession) -> Any:
    """The `http_client` of an agent on the driver's loop: straight to the gateway's handler when the
    gateway is in this process, else an ordinary client (its SSL context shared: agent_host.http_client)."""
    import httpx

    if session.transport is not None:
        return httpx.AsyncClient(transport=session.transport(), timeout=HTTP_TIMEOUT_S)
    return http_client()


def session_env(session: AgentSession, reward_file: str) -> dict[str, str]:
    """What a command agent's session adds to its allow-listed environment."""
    record = json.dumps(session.record, default=str)
    if len(record.encode()) > MAX_RECORD_ENV_BYTES:
        raise ValueError(f"the record is {len(record.encode())} bytes as JSON, over the {MAX_RECORD_ENV_BYTES} "
                         "an environment variable (SEER_RECORD) may hold")
    out = {"OPENAI_BASE_URL": session.base_url, "OPENAI_API_KEY": session.api_key,
           "SEER_SESSION_ID": session.session_id, "SEER_RECORD": record, "SEER_REWARD_FILE": reward_file}
    if session.model:
        out["SEER_MODEL"] = session.model
    return out


def _file_name(session_id: str) -> str:
    return re.sub(r"[^\w.-]", "_", session_id)[:200] or "session"


def _tail(path: Path, lines: int = 5, chars: int = 600) -> str:
    try:
        text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:]).strip()
    except OSError:
        return ""
    return text[-chars:]


class AgentRunner:
    """Runs the agent once per session: bounded (`max_concurrent`), timed (`spec.timeout_s`), contained.

    `log_dir`: where each session's stdout and stderr go (`<session id>.log`; process mode); None:
    a temporary directory, removed by close() (an error still quotes the log's last lines).
    """

    def __init__(self, spec: AgentSpec, max_concurrent: int, *, log_dir: str | os.PathLike | None = None) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        if spec.kind not in ("function", "command"):
            raise ValueError(f"AgentSpec.kind must be 'function' or 'command', got {spec.kind!r}")
        self.spec, self.max_concurrent = spec, max_concurrent
        self.in_process = spec.kind == "command" or spec.mode == "process"
        self._fn = resolve_agent(spec.target, dict(spec.args)) if spec.kind == "function" else None
        self._takes_model = self._fn is not None and takes_model(self._fn)
        self._takes_http_client = self._fn is not None and takes_http_client(self._fn)
        self._own_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="seer-agents-") if log_dir is None else log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._host: _Host | None = None
        self._retired: list[_Host] = []  # hosts that fork no more, stopped once their sessions end
        self._cold: str | None = None  # why hosts no longer import the agent (None: they do)
        self._server: _Server | None = None  # agent.serve: the one process serving sessions
        self._host_lock = threading.Lock()
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self.running = 0  # sessions running now
        self.peak_running = 0  # the most that ever ran at once
        self.closed = False

    def slots(self) -> asyncio.Semaphore:
        """The session slots, one set per event loop (the driver runs an asyncio.run per iteration)."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_concurrent))
        return self._slots[1]

    async def run(self, session: AgentSession) -> AgentOutcome:
        """Run the agent for one session. Its faults are the outcome's error (reward 0), never raised;
        cancelling this call kills the session's processes and passes the cancellation on."""
        if self.closed:
            raise RuntimeError("AgentRunner.run after close()")
        async with self.slots():
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
            try:
                if self.spec.serve:
                    return await self._run_served(session)
                if self.in_process:
                    return await self._run_in_process(session)
                return await self._run_in_loop(session)
            finally:
                self.running -= 1

    # ---- in the driver's event loop ----------------------------------------------------------

    async def _run_in_loop(self, session: AgentSession) -> AgentOutcome:
        t0 = time.monotonic()
        kwargs = self._kwargs(session)
        client = None
        if self._takes_http_client:
            client = kwargs[HTTP_CLIENT_KEYWORD] = in_loop_client(session)
        task = asyncio.ensure_future(call_agent(self._fn, kwargs, client))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.spec.timeout_s)
        except BaseException:
            task.cancel()
            raise
        wall = time.monotonic() - t0
        if not done:  # cancelled, not awaited: an agent that ignores its cancellation is left behind
            task.cancel()
            return AgentOutcome(0.0, self._timeout_error(), wall)
        reward, error = task.result()
        return AgentOutcome(0.0 if error else reward, error, wall)

    def _kwargs(self, session: AgentSession) -> dict[str, Any]:
        out = {**dict(self.spec.args), "base_url": session.base_url, "api_key": session.api_key,
               "session_id": session.session_id, "record": session.record}
        if self._takes_model and session.model:
            out[MODEL_KEYWORD] = session.model
        return out

    def _timeout_error(self) -> str:
        return f"TimeoutError: the agent ran past agent.timeout_s ({self.spec.timeout_s:g} s); its session was ended"

    # ---- in a process of its own ---------------------------------------------------------------

    def _get_host(self) -> "_Host":
        """The host new sessions go to: a new one when there is none, it failed, or it retired (its
        imports started a thread; it is stopped once its running sessions end, and hosts from then
        on are cold: each session imports the agent in its own process)."""
        with self._host_lock:
            host = self._host
            if host is None or not host.alive or host.retired is not None:
                if host is not None and host.retired is not None and self._cold is None:
                    self._cold = host.retired
                    log.warning("agent host: %s; sessions from now on start from a host that does not import the "
                                "agent (each imports it in its own process)", host.retired)
                if host is not None and host.alive:
                    self._retired.append(host)
                self._host = _Host(self.spec, self.log_dir / "agent-host.log", warm=self._cold is None)
            return self._host

    async def _run_in_process(self, session: AgentSession) -> AgentOutcome:
        name = _file_name(session.session_id)
        log_path = self.log_dir / f"{name}.log"
        reward_file = self.log_dir / f"{name}.reward"
        msg: dict[str, Any] = {"op": "start", "id": session.session_id, "log": str(log_path)}
        try:
            if json_size(session.session_id) > MAX_ID_BYTES:
                raise ValueError(f"its id is over {MAX_ID_BYTES} bytes as JSON")
            if self.spec.kind == "command":
                msg.update(argv=self.spec.argv, env=session_env(session, str(reward_file)))
            else:
                # the session's process makes the client (with the host's SSL context) and passes it
                msg.update(kwargs=self._kwargs(session), http_client=self._takes_http_client)
            data = frame(msg, MAX_DRIVER_FRAME_BYTES, allow_nan=True)
        except Exception as e:  # a record that is not plain JSON data, too large, or over the environment's bound
            return AgentOutcome(0.0, f"the session could not start: {error_line(e)}", 0.0, str(log_path), system=True)
        for _ in range(HOST_TRIES):
            host = self._get_host()
            ready = await host.wait_ready()
            if ready is not None:
                return AgentOutcome(0.0, ready, 0.0, system=True)
            try:
                pending = host.start(session.session_id, data)
            except HostRetired:
                continue
            except Exception as e:  # a host that died
                return AgentOutcome(0.0, f"the session could not start: {error_line(e)}", 0.0, str(log_path), system=True)
            done, wall = await self._wait_exit(pending, lambda: host.kill(session.session_id))
            if not done:
                return AgentOutcome(0.0, self._timeout_error(), wall, str(log_path))
            code = pending.exited.result()
            if pending.refused:
                continue
            reward, error = pending.result
            if code is None:  # the host failed (or was stopped) while the session ran
                error = f"{pending.host_error or 'the agent host exited'}; the session was ended"
            elif self.spec.kind == "command":
                reward, error = self._command_result(code, reward_file, log_path)
            elif not pending.reported:
                error = _exit_error(code) + self._quote(log_path)
            # code None: the host went away under the session (its exit was never reported): Seer's failure
            return AgentOutcome(0.0 if error else reward, error, wall, str(log_path),
                                system=code is None and error is not None)
        return AgentOutcome(0.0, f"the session could not start: {HOST_TRIES} agent hosts refused it", 0.0,
                            str(log_path), system=True)

    async def _wait_exit(self, pending: _Pending, end: Callable[[], None]) -> tuple[bool, float]:
        """Wait for a session's end, at most agent.timeout_s: (ended, its wall time). A session past
        its bound, or whose wait is cancelled, is ended (`end`)."""
        t0 = time.monotonic()
        try:
            done, _ = await asyncio.wait({pending.exited}, timeout=self.spec.timeout_s)
        except BaseException:
            end()
            raise
        if not done:
            end()
        return bool(done), time.monotonic() - t0

    # ---- in one long-lived process of the agent's (agent.serve) ------------------------------------

    def _get_server(self) -> "_Server":
        with self._host_lock:
            if self._server is None or not self._server.alive:
                self._server = _Server(self.spec, self.log_dir / "agent-server.log")
            return self._server

    async def _run_served(self, session: AgentSession) -> AgentOutcome:
        msg = {"op": "start", "id": session.session_id, "base_url": session.base_url, "api_key": session.api_key,
               "model": session.model, "record": session.record}
        try:
            if json_size(session.session_id) > MAX_ID_BYTES:
                raise ValueError(f"its id is over {MAX_ID_BYTES} bytes as JSON")
            data = frame(msg, MAX_DRIVER_FRAME_BYTES, allow_nan=True)
            server = self._get_server()
            pending = server.start(session.session_id, data)
        except Exception as e:  # a record that is not plain JSON data, a server that could not start
            return AgentOutcome(0.0, f"the session could not start: {error_line(e)}", 0.0)
        done, wall = await self._wait_exit(pending, lambda: server.cancel(session.session_id))
        if not done:
            return AgentOutcome(0.0, self._timeout_error(), wall)
        reward, error = pending.result
        if pending.exited.result() is None:
            error = f"{pending.host_error or 'the agent server exited'}; the session was ended" + self._quote(server.log)
        return AgentOutcome(0.0 if error else reward, error, wall)

    def _command_result(self, code: int | None, reward_file: Path, log: Path) -> tuple[float | None, str | None]:
        if code != 0:
            return None, _exit_error(code) + self._quote(log)
        try:
            text = reward_file.read_text().strip()
        except FileNotFoundError:
            return None, None
        except OSError as e:
            return None, f"reading its reward ({reward_file.name}): {e}"
        finally:
            reward_file.unlink(missing_ok=True)
        if not text:
            return None, None
        try:
            value = float(json.loads(text))
        except (ValueError, TypeError):
            return None, f"it wrote {text[:100]!r} as its reward; expected a number"
        if value != value or value in (float("inf"), float("-inf")):
            return None, f"it wrote {text[:100]!r} as its reward; expected a finite number"
        return value, None

    @staticmethod
    def _quote(log: Path) -> str:
        tail = _tail(log)
        return f"; its output ended: {tail}" if tail else ""

    async def close(self) -> None:
        """Stop the host and every session still running (their process groups killed)."""
        self.closed = True
        with self._host_lock:
            hosts = [h for h in (self._host, *self._retired, self._server) if h is not None]
            self._host, self._retired, self._server = None, [], None
        for host in hosts:
            await asyncio.get_running_loop().run_in_executor(None, host.stop)
        if self._own_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def _exit_error(code: int | None) -> str:
    if code is None:
        return "the agent host exited"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the agent's process was killed by {name}"
    return f"the agent's process exited with status {code} before it returned"


class HostRetired(Exception):
    """The host forks no more sessions: offer the session to another."""


@dataclass
class _Pending:
    """One session in the host: its process, what it reported, and the future of its exit."""

    loop: asyncio.AbstractEventLoop
    exited: asyncio.Future  # its exit code (None: the host is gone, or refused the session)
    pid: int | None = None  # checked to be a child of the host
    reported: bool = False  # whether a function session reported (the host's exit frame says)
    result: tuple[float | None, str | None] = (None, None)
    refused: bool = False  # the host had retired when the start reached it
    host_error: str | None = None  # why the host is gone, when it went with the session running


# What the host may send (seer.rollout.agent_host); any other frame ends the host.
_SHAPES: dict[str, dict[str, tuple[type, ...]]] = {
    "ready": {"ready": (bool,), "error": (str, type(None))},
    "retire": {"retire": (str,)},
    "pid": {"id": (str,), "pid": (int,)},
    "refused": {"id": (str,), "refused": (str,)},
    "exit": {"id": (str,), "exit": (int, type(None)), "reported": (bool,), **RESULT_SHAPE},
}


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class _FramedProcess:
    """A process of the agent's that the driver talks to in frames (a length and a JSON object) on a
    socket that is its stdin and stdout, read by a thread: the agent host, or a served command agent.
    Its sessions wait in `pending`; whatever ends the reading (a frame that is not one, the socket's
    end, an exception) ends the process and fails the sessions it held at once (`_ended`)."""

    WHAT = "agent process"  # its name in errors and the log

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.sock, theirs = socket.socketpair()
        try:
            with open(log, "ab") as err:  # its own errors (a host's sessions log apart)
                self.proc = subprocess.Popen(argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=err, env=env,
                                             start_new_session=True)
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()
        self.pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()  # the pending sessions and the process's state (the reader takes it too)
        self._write_lock = threading.Lock()  # frames to it, one at a time
        self.alive = True

    def _start_reader(self, name: str) -> None:
        self._reader = threading.Thread(target=self._read, name=name, daemon=True)
        self._reader.start()

    def _can_start(self) -> None:
        """Raise if no session may start now (under the lock)."""

    def start(self, sid: str, data: bytes) -> _Pending:
        """Send a start frame (`data`, made by the runner)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._can_start()
            if sid in self.pending:
                raise ValueError(f"session {sid!r} is already running")
            p = self.pending[sid] = _Pending(loop, loop.create_future())
        try:
            self._send_bytes(data)
        except BaseException:
            with self._lock:
                self.pending.pop(sid, None)
            raise
        return p

    def _send(self, msg: dict) -> None:
        self._send_bytes(frame(msg, MAX_DRIVER_FRAME_BYTES, allow_nan=True))

    def _send_bytes(self, data: bytes) -> None:
        with self._write_lock:
            if not self.alive:
                raise OSError(f"the {self.WHAT} has exited")
            self.sock.sendall(data)

    def _read(self) -> None:
        reader = FrameReader(MAX_HOST_FRAME_BYTES)
        reason = None
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                for msg in reader.feed(data):
                    self._dispatch(msg)
        except FrameError as e:
            reason = f"the {self.WHAT} sent a malformed frame ({e})"
        except BaseException as e:  # noqa: BLE001 - whatever it was, the process is no longer usable
            reason = f"reading the {self.WHAT} failed: {error_line(e)}"
        self.alive = False
        self._ended(reason)

    def _dispatch(self, msg: dict) -> None:
        raise NotImplementedError

    def _ended(self, reason: str | None) -> None:
        """After the reading ended (`reason`: why, None at the socket's end): the process is ended
        and waited for, and its sessions are failed."""
        raise NotImplementedError

    def _close(self, timeout_s: float, kill: bool) -> None:
        """End of input, then `timeout_s` for the process to exit; its group is killed after that, or
        in any case with `kill` (what it left behind); the socket closes once the reader is done."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill = True
        if kill:
            _kill_group(self.proc.pid)
            self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        if not self._reader.is_alive():
            self.sock.close()

    def _orphans(self) -> list[_Pending]:
        with self._lock:
            orphans, self.pending = list(self.pending.values()), {}
        return orphans


class _Host(_FramedProcess):
    """The driver's side of one agent host process (seer.rollout.agent_host): frames out on a socket
    that is its stdin and stdout, frames back read by a thread, which checks each (a bounded JSON
    object of a known shape) and hands it to its session's event loop. A frame that is not, or the
    socket's end, ends the host: its sessions fail at once and the runner starts another."""

    WHAT = "agent host"

    def __init__(self, spec: AgentSpec, log: Path, warm: bool = True) -> None:
        env = agent_inherited(spec.inherit_env)
        env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # the Agents SDK would send traces to OpenAI
        env[HIDE_ENV] = os.pathsep.join(hidden_paths())  # Ray's token, out of the agents' sight (seer.procs.contain)
        if spec.kind == "function":  # the host imports the agent from where the driver resolved it
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        super().__init__([sys.executable, "-m", "seer.rollout.agent_host", str(os.getpid()), spec.kind,
                          spec.target if spec.kind == "function" else "-", "warm" if warm else "cold"], env, log)
        self._ready = threading.Event()
        self._ready_error: str | None = None
        self.retired: str | None = None  # why the host forks no more
        self.failure: str | None = None  # why the host was ended (a frame it should not have sent)
        self._stop_sent = False
        self._start_reader("seer-agent-host")

    async def wait_ready(self) -> str | None:
        """None once the host has imported the agent, else why it cannot run sessions."""
        if not self._ready.is_set():
            ok = await asyncio.get_running_loop().run_in_executor(None, self._ready.wait, HOST_START_S)
            if not ok:
                return f"the agent host did not start within {HOST_START_S:g} s"
        return self._ready_error

    def _can_start(self) -> None:
        """HostRetired when this host forks no more."""
        if self.retired is not None or self._stop_sent:
            raise HostRetired(self.retired)

    def kill(self, sid: str) -> None:
        """Kill a session's process group (the host does it; it knows whether it reaped it already)."""
        try:
            self._send({"op": "kill", "id": sid})
        except OSError:
            pass
        with self._lock:
            p = self.pending.pop(sid, None)
        if p is not None and not self.alive and p.pid is not None:  # nobody reaps it: kill it from here
            _kill_group(p.pid)
        self._stop_if_retired()

    def _ended(self, reason: str | None) -> None:
        if reason is not None:
            self.failure = reason
            log.warning("%s; the host is ended, its sessions fail, and later sessions go to a new host", reason)
            _kill_group(self.proc.pid)  # its sessions die with it (PR_SET_PDEATHSIG)
        code = self.proc.wait()
        if reason is None and not self._stop_sent:
            reason = f"the agent host exited with status {code}"
        if not self._ready.is_set():
            self._ready_error = (f"the agent host failed while starting: {reason}" if self.failure else
                                 f"the agent host exited with status {code} while starting") + AgentRunner._quote(self.log)
            self._ready.set()
        for p in self._orphans():  # its sessions' processes die with it (PR_SET_PDEATHSIG); their groups too
            if p.pid is not None:
                _kill_group(p.pid)
            p.host_error = reason or "the agent host was stopped"
            _settle(p, None)

    def _dispatch(self, msg: dict) -> None:
        kind = next((k for k in ("ready", "retire", "pid", "refused", "exit") if k in msg), None)
        if kind is None:
            raise FrameError(f"a frame with keys {sorted(msg)[:8]}")
        check_shape(msg, _SHAPES[kind])
        if kind == "ready":
            if self._ready.is_set():
                raise FrameError("a second ready frame")
            self._ready_error = msg["error"] if not msg["ready"] else None
            if not msg["ready"] and not self._ready_error:
                raise FrameError("not ready, and no error")
            self._ready.set()
            return
        if kind == "retire":
            with self._lock:
                self.retired = bound_text(msg["retire"], 1000)
            self._stop_if_retired()
            return
        settle = None
        with self._lock:
            p = self.pending.get(msg["id"])
            if p is None:  # a session killed since (the host reports it all the same)
                return
            if kind == "pid":  # only a child of the host's is ever killed from here
                parent = _parent_of(msg["pid"])
                if p.pid is not None or parent not in (None, self.proc.pid):
                    raise FrameError(f"pid {msg['pid']} is not a new process of the agent host")
                p.pid = msg["pid"] if parent is not None else None  # None: reaped already
            elif kind == "refused":
                p.refused = True
                self.pending.pop(msg["id"], None)
                settle = None
            else:
                p.reported = msg["reported"]
                p.result = (msg["result"], msg["error"])
                self.pending.pop(msg["id"], None)
                settle = msg["exit"]
        if kind in ("refused", "exit"):
            _settle(p, settle)
            self._stop_if_retired()

    def _stop_if_retired(self) -> None:
        """A retired host is stopped once no session of it is left."""
        with self._lock:
            if self.retired is None or self.pending or self._stop_sent or not self.alive:
                return
            self._stop_sent = True
        try:
            self._send({"op": "stop"})
        except OSError:
            pass

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop_sent = True
        try:
            self._send({"op": "stop"})
        except OSError:
            pass
        self._close(timeout_s, kill=False)
class _Server(_FramedProcess):
    """The driver's side of a served command agent (agent.serve): its process, started once with the
    agent's environment, reads {op: start, id, base_url, api_key, model, record} and {op: cancel, id}
    on its stdin and writes one {id, reward, error} per session on its stdout (frames as the agent
    host's: a length and a JSON object, at most MAX_HOST_FRAME_BYTES from it). A frame that is not
    that, or its end, ends the process (its group killed): its sessions fail at once, and the next
    session starts another."""

    WHAT = "agent server"
    SHAPE: dict[str, tuple[type, ...]] = {"id": (str,), "reward": (int, float, type(None)), "error": (str, type(None))}

    def __init__(self, spec: AgentSpec, log: Path) -> None:
        env = agent_inherited(spec.inherit_env)
        env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
        env["SEER_SERVE"] = "1"
        env[HIDE_ENV] = os.pathsep.join(hidden_paths())  # as for the agent host: Ray's token out of sight
        super().__init__(contained_argv(list(spec.argv)), env, log)
        self._stopping = False
        self._start_reader("seer-agent-server")

    def cancel(self, sid: str) -> None:
        with self._lock:
            self.pending.pop(sid, None)
        try:
            self._send_bytes(frame({"op": "cancel", "id": sid}, MAX_DRIVER_FRAME_BYTES))
        except OSError:
            pass

    def _dispatch(self, msg: dict) -> None:
        check_shape(msg, self.SHAPE)
        with self._lock:
            p = self.pending.pop(msg["id"], None)
        if p is not None:
            p.result = (msg["reward"], msg["error"])
            _settle(p, 0)

    def _ended(self, reason: str | None) -> None:
        if reason is not None:
            log.warning("%s; it is ended, its sessions fail, and later sessions start another", reason)
        _kill_group(self.proc.pid)
        code = self.proc.wait()
        if reason is None:
            reason = "the agent server was stopped" if self._stopping else f"the agent server exited with status {code}"
        for p in self._orphans():
            p.host_error = reason
            _settle(p, None)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End of input tells the process to finish; its group is killed after `timeout_s`."""
        self._stopping = True
        self._close(timeout_s, kill=True)


def _settle(p: _Pending, code: int | None) -> None:
    def set_() -> None:
        if not p.exited.done():
            p.exited.set_result(code)

    try:
        p.loop.call_soon_threadsafe(set_)
    except RuntimeError:  # its event loop has closed: nobody waits for it
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


