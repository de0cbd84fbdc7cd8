"""Agents that misbehave on purpose, one behaviour per session (the record's "do"), for the runner's tests."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def spawn_tree(pid_file: str) -> None:
    """A child that starts a grandchild, both sleeping for an hour; their pids go to `pid_file`."""
    code = ("import subprocess, sys, time; "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); "
            f"open({pid_file!r}, 'a').write(f'{{g.pid}}\\n'); time.sleep(3600)")
    child = subprocess.Popen([sys.executable, "-c", code])
    with open(pid_file, "a") as f:
        f.write(f"{child.pid}\n{os.getpid()}\n")


def environment() -> dict[str, str]:
    """What this process was started with (/proc/self/environ) and what it holds now (os.environ)."""
    raw = Path("/proc/self/environ").read_bytes().decode(errors="replace")
    return {"proc": raw, "os": json.dumps(dict(os.environ))}


async def agent(base_url: str, api_key: str, session_id: str, record: dict) -> float | None:
    do = record["do"]
    if do == "ok":
        return record["reward"]
    if do == "none":
        return None
    if do == "crash":
        raise RuntimeError("the agent broke")
    if do == "exit":
        sys.exit(3)
    if do == "interrupt":
        raise KeyboardInterrupt
    if do == "hang":
        await asyncio.sleep(3600)
    if do == "block":  # blocks its event loop, not only its task
        time.sleep(3600)
    if do == "die":
        os._exit(9)
    if do == "tree":
        spawn_tree(record["pid_file"])
        await asyncio.sleep(3600)
    if do == "leave_tree":  # returns at once, leaving its processes behind
        spawn_tree(record["pid_file"])
        while len(Path(record["pid_file"]).read_text().split()) < 3:  # the grandchild has started
            await asyncio.sleep(0.05)
        return 1.0
    if do == "environ":
        Path(record["out"]).write_text(json.dumps(environment()))
        return 1.0
    if do == "junk":
        return "high"  # type: ignore[return-value]
    raise AssertionError(f"unknown behaviour {do!r}")


def not_async(base_url, api_key, session_id, record):
    return 1.0
