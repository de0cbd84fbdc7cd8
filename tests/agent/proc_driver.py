"""A driver as seer-run is one, for the /proc test: `python -m tests.agent.proc_driver OUT_DIR`.

Started by the test with secrets in its exec environment (the user's shell's), it protects itself as
seer-run's main does, launches the draft server with a fresh run secret (seer.dgds: a real
GuardedProcess handed its secret on a pipe), listens on a loopback port (the gateway's stand-in)
and runs the probe agent (tests.agent.proc_probe) once as a function agent and once as a command
agent, each in the agent host's contained processes, with Ray's token made as seer.fleet.ray_cluster
makes it. Writes OUT_DIR/driver.json: its pid, the run's secrets, the draft server's processes and
each session's outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path

from seer.dgds.server.config import DGDSConfig
from seer.dgds.server.service import DGDSService
from seer.procs.contain import protect
from seer.procs.process import _children
from seer.rollout.agents import AgentConfig, AgentRunner, AgentSession, AgentSpec
from tests.agent.proc_probe import holders


def serve_pongs(sock: socket.socket) -> None:
    while True:
        conn, _ = sock.accept()
        with conn:
            if conn.recv(5) == b"ping\n":
                conn.sendall(b"pong\n")


def tree(pid: int) -> list[int]:
    out = [pid]
    for child in _children(pid):
        out += tree(child)
    return out


async def run_agents(out: Path, port: int, files: list[str]) -> dict:
    results = {}
    for kind, target in (("function", "tests.agent.proc_probe:agent"),
                         ("command", f"{sys.executable} -m tests.agent.proc_probe"),
                         ("served", f"{sys.executable} -m tests.agent.proc_probe --serve")):
        cfg = AgentConfig(timeout_s=120.0, serve=kind == "served")
        runner = AgentRunner(AgentSpec.parse(target, 120.0, cfg=cfg), 2, log_dir=out / f"{kind}-logs")
        try:
            o = await runner.run(AgentSession(kind, "http://127.0.0.1:9/v1", f"key-{kind}",
                                              {"out": str(out / f"{kind}.json"), "port": port, "files": files}, "m"))
        finally:
            await runner.close()
        results[kind] = {"reward": o.reward, "error": o.error}
    return results


def main(out: Path) -> None:
    protect()  # what seer-run's main does first
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve_pongs, args=(listener,), daemon=True).start()
    ray_dir = Path(tempfile.mkdtemp(prefix="seer-ray-", dir="/tmp"))  # as seer.fleet.ray_cluster makes it
    try:
        token = ray_dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        with DGDSService.start(DGDSConfig(enabled=True, host="127.0.0.1", ready_timeout_s=120), out) as dgds:
            sessions = asyncio.run(run_agents(out, listener.getsockname()[1], [str(token)]))
            (out / "driver.json").write_text(json.dumps({
                "pid": os.getpid(), "dgds_token": dgds._token, "dgds_pids": tree(dgds.process.proc.pid),
                "dgds_holders": holders(tree(dgds.process.proc.pid)),
                "ray_token": token.read_text(), "ray_token_path": str(token), "sessions": sessions}))
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
