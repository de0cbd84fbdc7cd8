"""The agent host: one small process per run that forks a process per agent session.

`python -m seer.rollout.agent_host DRIVER_PID KIND TARGET` (started by seer.rollout.agents, never
by hand). It starts with the agent's environment only (seer.procs.environment.agent_inherited), so
no secret of the driver's is in any agent process, not even in /proc/<pid>/environ; it imports a
`module:function` agent once, so a session starts with a fork (milliseconds, the agent's imports
shared copy-on-write) instead of a fresh interpreter (seconds for the openai client or the Agents
SDK). Libraries import much lazily, on a client's first call (the openai client's HTTP stack: a
cold session took 1.8 s where a warm one took 0.2 s), so the first sessions list the modules they
imported and the host imports them too: later sessions start warm. Each session's process leads its own process group and dies with the host
(PR_SET_PDEATHSIG); when it ends (or is killed on timeout) its whole group goes, so a tool
subprocess it left behind goes too. A `module:function` session runs the function on its own
event loop and reports its reward; a command session execs the command.

Frames on both pipes are a 4-byte big-endian length and a pickle. In (stdin): `start` {id, kwargs, http_client,
log, argv, env}, `kill` {id}, `stop`. Out: {ready, error} once, {id, pid} per fork, {id, result,
error} from a function session's own process (one write of at most PIPE_BUF bytes, so atomic on the
shared pipe), {id, exit} when the host has reaped it. The host runs no user code itself and stays
single-threaded, so forking it is safe.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import math
import os
import pickle
import selectors
import signal
import struct
import sys
from collections.abc import Callable
from typing import Any

from seer.procs.contain import HIDE_ENV, contain_agent
from seer.procs.pdeathsig import set_parent_death_signal

HEADER = struct.Struct(">I")
# A function agent that takes a parameter of this name is given an httpx.AsyncClient for the gateway
# (seer.rollout.agents: in loop mode one over the gateway's handler in the driver, in process mode
# `http_client()` in the session's own process).
HTTP_CLIENT_KEYWORD = "http_client"
HTTP_TIMEOUT_S = 600.0  # the default timeout of the `http_client` agents are given (the openai client's own)
MAX_ERROR_CHARS = 1500  # a session's result frame must stay under PIPE_BUF (4096 bytes) to be atomic
WARM_SESSIONS = 4  # the first sessions tell the host which modules they imported late


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


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj)
    return HEADER.pack(len(data)) + data


def read_frames(buf: bytearray) -> list[Any]:
    """Take every complete frame off the front of `buf`."""
    out = []
    while len(buf) >= HEADER.size:
        (n,) = HEADER.unpack_from(buf)
        if len(buf) < HEADER.size + n:
            break
        out.append(pickle.loads(bytes(buf[HEADER.size:HEADER.size + n])))
        del buf[:HEADER.size + n]
    return out


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
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"


def check_reward(value: Any) -> float | None:
    """An agent's return value as a reward: a finite number, or None (the task's reward decides)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"the agent returned {value!r}; expected a finite number or None")
    return float(value)


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


class Host:
    def __init__(self, driver_pid: int, kind: str, target: str) -> None:
        self.driver_pid, self.kind = driver_pid, kind
        self.pid = os.getpid()
        self.fn: Callable[..., Any] | None = None
        self.children: dict[int, str] = {}  # pid -> session id
        self.lists: dict[int, str] = {}  # pid -> the file where a warming session lists its late imports
        self.warmed = 0
        self.stopping = False
        # Private copies of the pipes: fd 0, 1 and 2 become each session's /dev/null and log.
        self.inp = os.dup(0)
        self.out = os.dup(1)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        ready: dict[str, Any] = {"ready": True, "error": None}
        if kind == "function":
            try:
                self.fn = _load(target)
            except BaseException as e:  # noqa: BLE001 - reported to the driver, which fails its sessions
                ready = {"ready": False, "error": f"importing {target!r}: {error_line(e)}"}
        self.send(ready)

    def send(self, obj: Any) -> None:
        _write_all(self.out, frame(obj))

    def run(self) -> int:
        signal.set_wakeup_fd(self.wake_w)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C reaches the driver, which stops us
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != self.driver_pid:  # the driver died before the death signal was set
            self.stopping = True
        sel = selectors.DefaultSelector()
        sel.register(self.inp, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        buf = bytearray()
        while not self.stopping:
            for key, _ in sel.select(timeout=1.0):
                if key.fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                data = os.read(self.inp, 1 << 16)
                if not data:  # the driver closed the pipe (or died)
                    self.stopping = True
                    break
                buf += data
                for msg in read_frames(buf):
                    self.handle(msg)
            self.reap()
            if os.getppid() != self.driver_pid:
                self.stopping = True
        for pid in list(self.children):
            _kill_group(pid)
        self.reap(block=True)
        return 0

    def _on_signal(self, signum, frame) -> None:
        if signum != signal.SIGCHLD:
            self.stopping = True

    def handle(self, msg: dict) -> None:
        op = msg["op"]
        if op == "stop":
            self.stopping = True
        elif op == "kill":
            for pid, sid in self.children.items():
                if sid == msg["id"]:
                    _kill_group(pid)
        elif op == "start":
            self.start(msg)

    def warm(self, path: str | None) -> None:
        """Import what a finished session imported late, so the next sessions start with it."""
        if path is None:
            return
        try:
            with open(path) as f:
                names = f.read().split()
            os.unlink(path)
        except OSError:
            return
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a module made at run time, or one that needs its session
                pass

    def start(self, msg: dict) -> None:
        if self.kind == "function" and self.warmed < WARM_SESSIONS:
            self.warmed += 1
            msg["modules"] = f"{msg['log'] or '/tmp/seer-agent'}.{self.warmed}.modules"
        if msg.get("http_client"):
            ssl_context()  # made once here, shared by every session's client
        gc.freeze()  # the host's objects: never scanned by a session's collector, so their pages stay shared
        pid = os.fork()
        if pid == 0:
            try:
                self._child(msg)
            finally:
                os._exit(70)
        try:
            os.setpgid(pid, pid)  # also done by the child: whichever runs first, the group exists now
        except OSError:
            pass
        self.children[pid] = msg["id"]
        if msg.get("modules"):
            self.lists[pid] = msg["modules"]
        self.send({"id": msg["id"], "pid": pid})

    def _child(self, msg: dict) -> None:
        """In the session's own process: never returns."""
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != self.pid:  # the host died before the death signal was set
            os._exit(1)
        for fd in (self.inp, self.wake_r, self.wake_w):
            os.close(fd)
        log = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if msg.get("log") else os.open(
            os.devnull, os.O_WRONLY)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        if self.kind == "command":
            os.close(self.out)
            env = dict(os.environ)
            env.update(msg["env"])
            try:
                os.execvpe(msg["argv"][0], msg["argv"], env)
            except OSError as e:
                os.write(2, f"cannot run {msg['argv'][0]!r}: {e}\n".encode())
                os._exit(127)
        before = set(sys.modules)
        reward, error = (asyncio.run(_session(self.fn, msg["kwargs"], bool(msg.get("http_client"))))
                         if self.fn is not None else (None, "no agent"))
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
        _write_all(self.out, frame({"id": msg["id"], "result": reward, "error": error}))
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
            sid = self.children.pop(pid, None)
            if sid is None:
                continue
            _kill_group(pid)  # whatever the session left behind in its group
            self.warm(self.lists.pop(pid, None))
            try:
                self.send({"id": sid, "exit": os.waitstatus_to_exitcode(status)})
            except OSError:  # the driver is gone
                self.stopping = True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("function", "command"):
        print("usage: python -m seer.rollout.agent_host DRIVER_PID function|command TARGET", file=sys.stderr)
        return 2
    # before any agent code runs here or in a session forked from here (seer.procs.contain)
    print(contain_agent(tuple(p for p in os.environ.pop(HIDE_ENV, "").split(os.pathsep) if p)), file=sys.stderr)
    return Host(int(argv[0]), argv[1], argv[2]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
