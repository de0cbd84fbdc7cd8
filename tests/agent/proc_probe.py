"""An agent that tries every /proc route to other processes' secrets, and reports what it got.

As a function agent (`tests.agent.proc_probe:agent`) or a command agent (`python -m
tests.agent.proc_probe`, its record in SEER_RECORD): for every pid it can see it reads environ,
cmdline, maps, the top of its stack and its heap through mem, and its open files; then its own
environment. It also does what an agent must be able to do (connect to a loopback port, read its own
source, write a temporary file). The report (JSON, to the record's "out") holds every byte it read,
so the test searches it for the run's secrets, and what each route answered.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROUTES = ("environ", "cmdline", "maps", "mem", "fd", "auxv")
MEM_BYTES = 1 << 20  # per region: the stack's top (the exec environment) and the heap's start


def _read_mem(pid: int) -> bytes:
    regions = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] in ("[stack]", "[heap]") and parts[1].startswith("r"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                regions.append((max(lo, hi - MEM_BYTES) if parts[5] == "[stack]" else lo,
                                min(hi, lo + MEM_BYTES) if parts[5] == "[heap]" else hi))
    out = b""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)  # the access check is here: EACCES/EPERM when refused
    try:
        for lo, hi in regions:
            try:
                out += os.pread(fd, hi - lo, lo)
            except OSError:
                pass
    finally:
        os.close(fd)
    return out


def _route(pid: int, route: str) -> bytes:
    if route == "mem":
        return _read_mem(pid)
    if route == "fd":
        names = os.listdir(f"/proc/{pid}/fd")
        return "\n".join(os.readlink(f"/proc/{pid}/fd/{n}") for n in names).encode()
    with open(f"/proc/{pid}/{route}", "rb") as f:
        return f.read()


def read_all(pids: list[int], routes: tuple[str, ...] = ROUTES) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Each route of each pid: {pid: {route: "read" or the errno's name}}, and every text read."""
    answers: dict[str, dict[str, str]] = {}
    got: list[str] = []
    for pid in pids:
        answers[str(pid)] = {}
        for route in routes:
            try:
                data = _route(pid, route)
            except OSError as e:
                answers[str(pid)][route] = errno.errorcode.get(e.errno or 0, str(e.errno))
                continue
            answers[str(pid)][route] = "read"
            got.append(data.decode("latin-1"))
    return answers, got


def holders(pids: list[int]) -> list[int]:
    """Those of `pids` that hold a run secret: not a guard or its sentinel, not multiprocessing's
    resource tracker, not Mooncake's processes (none is given one); what Seer makes non-dumpable."""
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if not any(x in cmd for x in (b"seer.procs.guard", b"resource_tracker", b"mooncake")):
            out.append(pid)
    return out


def as_an_agent(pids: list[int]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """`read_all(pids)` from a process contained as an agent's is (seer.procs.contain.contain_agent)."""
    code = ("import json, sys\nfrom seer.procs.contain import contain_agent\nfrom tests.agent.proc_probe import read_all\n"
            "contain_agent()\nprint(json.dumps(read_all([int(p) for p in sys.argv[1:]])))")
    done = subprocess.run([sys.executable, "-c", code, *map(str, pids)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"the probe failed: {done.stderr[-2000:]}")
    answers, got = json.loads(done.stdout)
    return answers, got


def probe(port: int | None, files: list[str] = ()) -> dict:
    me = os.getpid()
    answers, got = read_all([int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me])
    for path in files:  # files of the run's user it knows the names of (Ray's token)
        try:
            got.append(Path(path).read_bytes().decode("latin-1"))
            answers[path] = {"read": "read"}
        except OSError as e:
            answers[path] = {"read": errno.errorcode.get(e.errno or 0, str(e.errno))}
    own = {"proc_environ": Path("/proc/self/environ").read_bytes().decode("latin-1"),
           "os_environ": json.dumps(dict(os.environ))}
    # what an agent needs: its own files, a temporary file, the gateway over loopback
    can = {"read_own_source": bool(Path(__file__).read_text()),
           "tmp_file": False, "loopback": False}
    with tempfile.NamedTemporaryFile("w", delete=True) as f:
        f.write("x")
        f.flush()
        can["tmp_file"] = Path(f.name).read_text() == "x"
    if port is not None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"ping\n")
            can["loopback"] = s.recv(5) == b"pong\n"
    caps = {line.split(":")[0]: line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("Cap")}
    return {"pid": me, "answers": answers, "got": got, "own": own, "can": can, "caps": caps}


async def agent(base_url: str, api_key: str, session_id: str, record: dict) -> float:
    Path(record["out"]).write_text(json.dumps(probe(record.get("port"), record.get("files", []))))
    return 1.0


def serve_one(session: dict) -> float:
    """agent.serve: the same probe, from the one process that serves the run's sessions."""
    record = session["record"]
    Path(record["out"]).write_text(json.dumps(probe(record.get("port"), record.get("files", []))))
    return 1.0


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        from seer.tasks.agents.serve_sessions import serve

        return serve(serve_one)
    record = json.loads(os.environ["SEER_RECORD"])
    Path(record["out"]).write_text(json.dumps(probe(record.get("port"), record.get("files", []))))
    Path(os.environ["SEER_REWARD_FILE"]).write_text("1.0\n")


if __name__ == "__main__":
    sys.exit(main())
