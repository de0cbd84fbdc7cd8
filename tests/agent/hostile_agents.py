"""Agents that attack the agent host's channels or its single thread, for tests/agent/test_agent_channels.py."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import pickle
import stat
import struct
from pathlib import Path


class _RunsInTheDriver:
    """Unpickling this runs `touch <marker>`: what a pickled frame could do to whoever loads it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def forged_frames(record: dict) -> list[bytes]:
    """A pickled frame that runs a command, and JSON frames claiming another session's result."""
    victim = record["victim"]
    bodies = [pickle.dumps(_RunsInTheDriver(record["marker"])),
              json.dumps({"id": victim, "result": 1.0, "error": None}).encode(),
              json.dumps({"id": victim, "exit": 0, "reported": True, "result": 1.0, "error": None}).encode(),
              json.dumps({"result": 1.0, "error": None}).encode()]
    return [struct.pack(">I", len(b)) + b for b in bodies]


def fd_targets(pid: int | str) -> dict[str, str]:
    out = {}
    base = Path(f"/proc/{pid}/fd")
    for entry in base.iterdir():
        try:
            out[entry.name] = os.readlink(entry)
        except OSError:
            pass
    return out


def forge(record: dict) -> dict:
    """Write the forged frames to every pipe and socket this process can reach: its own descriptors,
    its parent's (the host) through /proc, and the driver's pipes to the host through /proc. Returns
    what it found and wrote."""
    found = {"own": fd_targets("self"), "host": fd_targets(os.getppid()), "wrote": [], "refused": []}
    frames = forged_frames(record)
    shared = set(found["host"].values())
    for pid in ("self", os.getppid(), record["driver_pid"]):
        targets = fd_targets(pid)
        for entry in Path(f"/proc/{pid}/fd").iterdir():
            if pid == record["driver_pid"] and targets.get(entry.name) not in shared:
                continue  # of the driver's, the pipes it shares with the host (not the test's own output)
            try:
                mode = os.stat(entry).st_mode
            except OSError:
                continue
            if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
                continue
            where = f"{pid}:{entry.name}"
            try:
                if pid == "self":
                    fd = int(entry.name)
                    for f in frames:
                        os.write(fd, f)
                else:
                    fd = os.open(entry, os.O_WRONLY | os.O_NONBLOCK)
                    try:
                        for f in frames:
                            os.write(fd, f)
                    finally:
                        os.close(fd)
                found["wrote"].append(where)
            except OSError as e:
                found["refused"].append(f"{where}: {e.strerror}")
    return found


def parent_threads() -> dict:
    """The process this session was forked from, and how many threads it had."""
    ppid = os.getppid()
    return {"ppid": ppid, "threads": len(os.listdir(f"/proc/{ppid}/task"))}


async def agent(base_url: str, api_key: str, session_id: str, record: dict):
    do = record["do"]
    if do == "ok":
        return record["reward"]
    if do == "sleep_then":  # pending in the host for a while, then its own reward
        await asyncio.sleep(record["sleep_s"])
        return record["reward"]
    if do == "hang":
        await asyncio.sleep(3600)
    if do == "forge":
        found = forge(record)
        Path(record["out"]).write_text(json.dumps(found))
        return 1.0
    if do == "long_error":
        raise RuntimeError(record["text"])
    if do == "poison":  # imports late a module that, imported in the host, writes garbage to the driver
        importlib.import_module("tests.agent.garbage_on_import")
        return 1.0
    if do == "parent_threads":
        if record.get("import"):
            importlib.import_module(record["import"])
        with open(record["out"], "a") as f:
            f.write(json.dumps({"sid": session_id, **parent_threads()}) + "\n")
        return 1.0
    if do == "number":
        import numpy as np

        kind, value = record["type"], record["value"]
        if kind == "big_int":
            return 10 ** 400
        return getattr(np, kind)(value) if kind != "array" else np.array(value)
    raise AssertionError(f"unknown behaviour {do!r}")
