"""The agent host: one small process per run that forks a process per agent session.

`python -m seer.rollout.agent_host DRIVER_PID KIND TARGET [warm|cold]` (started by
seer.rollout.agents, never by hand). It starts with the agent's environment only
(seer.procs.environment.agent_inherited), so no secret of the driver's is in any agent process, not
even in /proc/<pid>/environ; a warm host imports a `module:function` agent once, so a session starts
with a fork (milliseconds, the agent's imports shared copy-on-write) instead of a fresh interpreter
(seconds for the openai client or the Agents SDK). Libraries import much lazily, on a client's first
call (the openai client's HTTP stack: a cold session took 1.8 s where a warm one took 0.2 s), so the
first sessions list the modules they imported and the host imports them too: later sessions start
warm. Forking is safe only from a single-threaded process: a host whose imports started a thread
retires (it forks no more sessions, and the driver starts a cold host, which imports nothing of the
agent's: each session imports it in its own process). Each session's process leads its own process
group and dies with the host (PR_SET_PDEATHSIG); when it ends (or is killed on timeout) its whole
group goes, so a tool subprocess it left behind goes too. A `module:function` session runs the
function on its own event loop and reports its reward; a command session execs the command.

Every channel carries frames of plain data: a 4-byte big-endian length and a JSON object (UTF-8),
bounded in bytes per channel, never code (no pickle). The driver's channel is one socket (the host's
stdin and stdout): in, `start` {id, log, kwargs, http_client} or {id, log, argv, env}, `kill` {id},
`stop`; out, {ready, error} once, {retire} if the host must fork no more, {id, pid} per fork,
{id, refused} for a start a retired host turned down, {id, exit, reported, result, error} when the
host has reaped a session. A function session reports {result, error} on a socket of its own that
only the host reads (its session is the socket's, whatever the frame says); the host checks it and
relays it in the exit frame. A session's process holds no other descriptor of the host's (the
driver's socket and the other sessions' are closed after the fork). The host runs no agent code in
its own loop (only the imports above) and stays single-threaded, so forking it is safe.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import math
import os
import re
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

from seer.procs.contain import HIDE_ENV, contain_agent
from seer.procs.pdeathsig import set_parent_death_signal
from seer.tasks.reward import as_reward

HEADER = struct.Struct(">I")
# Frame bounds, in bytes of JSON (the 4-byte header not counted). The driver's frames carry a
# session's record and task.agent_args; the host's and the sessions' only ids, numbers and bounded texts.
MAX_DRIVER_FRAME_BYTES = 16 << 20  # driver -> host
MAX_HOST_FRAME_BYTES = 16 << 10  # host -> driver
MAX_RESULT_FRAME_BYTES = 4096  # a session -> the host ({result, error}): one write of at most PIPE_BUF
MAX_ERROR_BYTES = 2048  # an error text as JSON (UTF-8, escapes included): fits a result frame
MAX_ID_BYTES = 1024  # a session id as JSON
# A function agent that takes a parameter of this name is given an httpx.AsyncClient for the gateway
# (seer.rollout.agents: in loop mode one over the gateway's handler in the driver, in process mode
# `http_client()` in the session's own process).
HTTP_CLIENT_KEYWORD = "http_client"
HTTP_TIMEOUT_S = 600.0  # the default timeout of the `http_client` agents are given (the openai client's own)
WARM_SESSIONS = 4  # the first sessions tell the host which modules they imported late
MAX_WARM_MODULES = 5000  # what one session's list may name
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class FrameError(ValueError):
    """A frame that is not a bounded JSON object of the expected shape."""


def json_size(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False).encode())


def bound_text(text: str, limit: int = MAX_ERROR_BYTES) -> str:
    """`text`, cut (ending in "…") so that its JSON encoding is at most `limit` bytes: UTF-8 and JSON
    escapes (6 bytes for a control character) make bytes, not characters, the measure."""
    if json_size(text) <= limit:
        return text
    lo, hi = 0, min(len(text), limit)  # every character costs at least one byte
    while lo < hi:  # the longest prefix that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if json_size(text[:mid] + "…") <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + "…"


def frame(obj: dict, limit: int, *, allow_nan: bool = False) -> bytes:
    """One frame: the header and `obj` as JSON; FrameError when over `limit` bytes (nothing is cut
    here: callers bound their texts with bound_text)."""
    try:
        data = json.dumps(obj, ensure_ascii=False, allow_nan=allow_nan, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
        raise FrameError(f"not plain JSON data: {e}") from None
    if len(data) > limit:
        raise FrameError(f"a frame of {len(data)} bytes, over the {limit}-byte bound")
    return HEADER.pack(len(data)) + data


def _no_constants(name: str) -> Any:
    raise FrameError(f"{name} is not a number a frame may carry")


class FrameReader:
    """Frames off a byte stream: each at most `limit` bytes, each a JSON object (FrameError otherwise,
    and the stream is then unusable: its framing is lost)."""

    def __init__(self, limit: int, *, allow_nan: bool = False) -> None:
        self.limit, self.allow_nan = limit, allow_nan
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self.buf += data
        out = []
        while len(self.buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self.buf)
            if n > self.limit:
                raise FrameError(f"a frame of {n} bytes announced, over the {self.limit}-byte bound")
            if len(self.buf) < HEADER.size + n:
                break
            out.append(decode(bytes(self.buf[HEADER.size:HEADER.size + n]), self.allow_nan))
            del self.buf[:HEADER.size + n]
        return out


def decode(data: bytes, allow_nan: bool = False) -> dict:
    try:
        if allow_nan:
            obj = json.loads(data.decode("utf-8"))
        else:
            obj = json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except FrameError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FrameError(f"not a JSON frame: {bound_text(str(e), 200)}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"a frame must be a JSON object, got {type(obj).__name__}")
    return obj


def check_shape(msg: dict, shape: dict[str, tuple[type, ...]]) -> None:
    """`msg` has exactly the keys of `shape`, each of one of its types (a bool is not an int here)."""
    if set(msg) != set(shape):
        raise FrameError(f"a frame with keys {sorted(msg)[:8]}; expected {sorted(shape)}")
    for key, types in shape.items():
        v = msg[key]
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise FrameError(f"{key!r} is {type(v).__name__}; expected {'/'.join(t.__name__ for t in types)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise FrameError(f"{key!r} is {v}")
        if isinstance(v, str) and json_size(v) > (MAX_ID_BYTES if key == "id" else MAX_ERROR_BYTES):
            raise FrameError(f"{key!r} is a text over its bound")


RESULT_SHAPE: dict[str, tuple[type, ...]] = {"result": (int, float, type(None)), "error": (str, type(None))}


_SSL: list[Any] = []


def ssl_context() -> Any:
    """One SSL context per process for the `http_client`s agents are given: loading the CA bundle
    costs ~70 ms of CPU per context (what httpx does for every client it makes). The host makes it
    before it forks, so every session shares it."""
    if not _SSL:
        import ssl

        import certifi

        _SSL.append(ssl.create_default_context(cafile=certifi.where()))
    return _SSL[0]


def http_client() -> Any:
    """An ordinary httpx client for an agent, on this process's one SSL context."""
    import httpx

    return httpx.AsyncClient(verify=ssl_context(), timeout=HTTP_TIMEOUT_S)


async def _session(fn: Callable[..., Any], kwargs: dict, give_client: bool) -> tuple[float | None, str | None]:
    """A function session's coroutine: with `give_client`, the agent is given `http_client()`, made
    here on the SSL context the host made before it forked (closed after it)."""
    client = None
    if give_client:
        client = kwargs[HTTP_CLIENT_KEYWORD] = http_client()
    return await call_agent(fn, kwargs, client)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _load(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def error_line(e: BaseException) -> str:
    """An exception as one bounded text (MAX_ERROR_BYTES as JSON, whatever its characters)."""
    try:
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    except BaseException:  # noqa: BLE001 - an agent's exception whose __str__ raises
        text = type(e).__name__
    return bound_text(text)


def check_reward(value: Any) -> float | None:
    """An agent's return value as a reward: None (the task's reward decides) or what a reward function
    may return (seer.tasks.reward.as_reward: a finite real number of any numeric type, not a bool)."""
    if value is None:
        return None
    try:
        return as_reward(value, "the agent")
    except TypeError as e:
        raise TypeError(f"{e}; or None (the task's reward decides)") from None


async def call_agent(fn: Callable[..., Any], kwargs: dict, client: Any = None) -> tuple[float | None, str | None]:
    """Await the agent, and turn whatever it raises (SystemExit, KeyboardInterrupt too) into its error;
    `client` (the `http_client` it was given) is closed after it."""
    try:
        return check_reward(await fn(**kwargs)), None
    except BaseException as e:  # noqa: BLE001 - the agent's fault, reported as its session's error
        return None, error_line(e)
    finally:
        if client is not None:
            try:
                await client.aclose()
            except BaseException:  # noqa: BLE001 - the agent may have closed it, or broken it
                pass


def thread_count() -> int:
    """This process's threads, as the kernel counts them (threads a C library started included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def read_result(fd: int) -> tuple[bool, float | None, str | None]:
    """What a session reported on its own socket (read once it has exited, then closed): (reported,
    result, error). Exactly one well-formed {result, error} frame, or the session's own error."""
    data = b""
    try:
        while len(data) <= MAX_RESULT_FRAME_BYTES + HEADER.size:
            chunk = os.read(fd, MAX_RESULT_FRAME_BYTES + HEADER.size + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except (BlockingIOError, ConnectionResetError):
        pass
    finally:
        os.close(fd)
    if not data:
        return False, None, None
    try:
        reader = FrameReader(MAX_RESULT_FRAME_BYTES)
        msgs = reader.feed(data)
        if len(msgs) != 1 or reader.buf:
            raise FrameError(f"{len(msgs)} whole frame(s) and {len(reader.buf)} more bytes; expected one frame")
        check_shape(msgs[0], RESULT_SHAPE)
    except FrameError as e:
        return True, None, bound_text(f"the session's process wrote a malformed result on its channel: {e}")
    msg = msgs[0]
    return True, (None if msg["error"] is not None else msg["result"]), msg["error"]


class _Child:
    __slots__ = ("sid", "chan", "modules")

    def __init__(self, sid: str, chan: int | None, modules: str | None) -> None:
        self.sid, self.chan, self.modules = sid, chan, modules


class Host:
    def __init__(self, driver_pid: int, kind: str, target: str, warm: bool = True) -> None:
        self.driver_pid, self.kind, self.target = driver_pid, kind, target
        self.warm_host = warm and kind == "function"
        self.pid = os.getpid()
        self.fn: Callable[..., Any] | None = None
        self.children: dict[int, _Child] = {}
        self.warmed = 0
        self.stopping = False
        self.retired: str | None = None
        # The driver's socket (fd 0 and fd 1 both): a private copy; fd 0 and 1 become /dev/null, and
        # in a session 1 and 2 its log.
        self.chan = os.dup(0)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        ready: dict[str, Any] = {"ready": True, "error": None}
        if self.warm_host:
            try:
                self.fn = _load(target)
            except BaseException as e:  # noqa: BLE001 - reported to the driver, which fails its sessions
                ready = {"ready": False, "error": bound_text(f"importing {target!r}: {error_line(e)}")}
        self.send(ready)
        if ready["ready"]:
            self.check_threads(f"importing {target!r}")

    def send(self, obj: dict) -> None:
        _write_all(self.chan, frame(obj, MAX_HOST_FRAME_BYTES))

    def check_threads(self, after: str) -> bool:
        """False (and the host retires: it forks no more) when this process has more than one thread:
        a fork copies only the calling thread, and whatever lock another thread held stays held in
        the session's process."""
        if self.retired is None and (n := thread_count()) > 1:
            self.retired = bound_text(f"the agent host has {n} threads after {after} (a module started a thread "
                                      "at import); forking it is unsafe, so it forks no more sessions", 1000)
            print(f"seer agent host: {self.retired}", file=sys.stderr, flush=True)
            self.send({"retire": self.retired})
        return self.retired is None

    def run(self) -> int:
        signal.set_wakeup_fd(self.wake_w)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C reaches the driver, which stops us
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != self.driver_pid:  # the driver died before the death signal was set
            self.stopping = True
        sel = selectors.DefaultSelector()
        sel.register(self.chan, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        reader = FrameReader(MAX_DRIVER_FRAME_BYTES, allow_nan=True)
        code = 0
        while not self.stopping:
            for key, _ in sel.select(timeout=1.0):
                if key.fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                try:
                    data = os.read(self.chan, 1 << 16)
                except ConnectionResetError:
                    data = b""
                if not data:  # the driver closed its socket (or died)
                    self.stopping = True
                    break
                try:
                    for msg in reader.feed(data):
                        self.handle(msg)
                except (FrameError, KeyError, TypeError) as e:  # the driver's frames are ours: a bug
                    print(f"seer agent host: a bad frame from the driver: {error_line(e)}", file=sys.stderr, flush=True)
                    self.stopping, code = True, 1
                    break
            self.reap()
            if os.getppid() != self.driver_pid:
                self.stopping = True
        for pid in list(self.children):
            _kill_group(pid)
        self.reap(block=True)
        return code

    def _on_signal(self, signum, frame) -> None:
        if signum != signal.SIGCHLD:
            self.stopping = True

    def handle(self, msg: dict) -> None:
        op = msg["op"]
        if op == "stop":
            self.stopping = True
        elif op == "kill":
            for pid, child in self.children.items():
                if child.sid == msg["id"]:
                    _kill_group(pid)
        elif op == "start":
            self.start(msg)

    def warm(self, path: str | None) -> None:
        """Import what a finished session imported late, so the next sessions start with it."""
        if path is None:
            return
        try:
            with open(path) as f:
                names = f.read(1 << 20).split()[:MAX_WARM_MODULES]
            os.unlink(path)
        except (OSError, UnicodeDecodeError):
            return
        for name in names:
            if not _MODULE_NAME.fullmatch(name):
                continue
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a module made at run time, or one that needs its session
                pass
        self.check_threads(f"importing the modules the first sessions imported late ({path})")

    def start(self, msg: dict) -> None:
        sid = msg["id"]
        if not isinstance(sid, str):
            raise TypeError("a session id must be a string")
        if self.retired is None:  # whatever made a thread, the fork below must not happen with it
            self.check_threads("a session")
        if self.retired is not None:
            self.send({"id": sid, "refused": self.retired})
            return
        if self.kind == "function" and self.warm_host and self.warmed < WARM_SESSIONS:
            self.warmed += 1
            msg["modules"] = f"{msg['log'] or '/tmp/seer-agent'}.{self.warmed}.modules"
        if msg.get("http_client"):
            ssl_context()  # made once here, shared by every session's client
        gc.freeze()  # the host's objects: never scanned by a session's collector, so their pages stay shared
        ours = theirs = None
        if self.kind == "function":  # the session's own channel: only this process reads the other end
            a, b = socket.socketpair()
            ours, theirs = a.detach(), b.detach()
        pid = os.fork()
        if pid == 0:
            try:
                if ours is not None:
                    os.close(ours)
                self._child(msg, theirs)
            finally:
                os._exit(70)
        if theirs is not None:
            os.close(theirs)
            os.set_blocking(ours, False)
        try:
            os.setpgid(pid, pid)  # also done by the child: whichever runs first, the group exists now
        except OSError:
            pass
        self.children[pid] = _Child(sid, ours, msg.get("modules"))
        self.send({"id": sid, "pid": pid})

    def _child(self, msg: dict, chan: int | None) -> None:
        """In the session's own process: never returns."""
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != self.pid:  # the host died before the death signal was set
            os._exit(1)
        log = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if msg.get("log") else os.open(
            os.devnull, os.O_WRONLY)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        # Every descriptor but 0 (/dev/null), 1 and 2 (the log) and the session's own channel: the
        # driver's socket, the host's wake pipe, the other sessions' channels, whatever an import opened.
        if chan is None:
            os.closerange(3, 1 << 20)
        else:
            os.closerange(3, chan)
            os.closerange(chan + 1, 1 << 20)
        # Contained already: the host dropped its capabilities before any agent code (main), and a
        # session's process is its fork (seer.procs.contain).
        if self.kind == "command":
            env = dict(os.environ)
            env.update(msg["env"])
            try:
                os.execvpe(msg["argv"][0], msg["argv"], env)
            except OSError as e:
                os.write(2, f"cannot run {msg['argv'][0]!r}: {e}\n".encode())
                os._exit(127)
        assert chan is not None
        before = set(sys.modules)
        fn, error = self.fn, None
        if fn is None:  # a cold host: the session imports the agent itself
            try:
                fn = _load(self.target)
            except BaseException as e:  # noqa: BLE001 - its own session's error
                error = bound_text(f"importing {self.target!r}: {error_line(e)}")
        reward = None
        if fn is not None:
            reward, error = asyncio.run(_session(fn, msg["kwargs"], bool(msg.get("http_client"))))
        if msg.get("modules") and error is None:
            try:
                with open(msg["modules"], "w") as f:
                    f.write("\n".join(sorted(set(sys.modules) - before)))
            except OSError:
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - the agent may have closed or replaced them
                pass
        try:
            _write_all(chan, frame({"result": reward, "error": error}, MAX_RESULT_FRAME_BYTES))
        except OSError:
            os._exit(71)
        os._exit(0)

    def reap(self, block: bool = False) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            _kill_group(pid)  # whatever the session left behind in its group
            reported, result, error = read_result(child.chan) if child.chan is not None else (False, None, None)
            if reported and error is None:
                self.warm(child.modules)
            elif child.modules:
                try:
                    os.unlink(child.modules)
                except OSError:
                    pass
            try:
                self.send({"id": child.sid, "exit": os.waitstatus_to_exitcode(status), "reported": reported,
                           "result": result, "error": error})
            except OSError:  # the driver is gone
                self.stopping = True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[1] not in ("function", "command") or argv[3:] not in ([], ["warm"], ["cold"]):
        print("usage: python -m seer.rollout.agent_host DRIVER_PID function|command TARGET [warm|cold]",
              file=sys.stderr)
        return 2
    # before any agent code runs here or in a session forked from here (seer.procs.contain)
    print(contain_agent(tuple(p for p in os.environ.pop(HIDE_ENV, "").split(os.pathsep) if p)), file=sys.stderr)
    return Host(int(argv[0]), argv[1], argv[2], warm=argv[3:] != ["cold"]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
