"""What a test's processes expose: the TCP addresses they listen on, and their command lines."""

from __future__ import annotations

import os
import re
import socket
import struct
from pathlib import Path

from seer.procs.process import _children


def process_tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of `pids` holds (IPv4 and IPv6)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path(f"/proc/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = f[1].split(":")
            raw = bytes.fromhex(addr_hex)
            if family == socket.AF_INET:
                addr = socket.inet_ntop(family, raw[::-1])
            else:
                addr = socket.inet_ntop(family, b"".join(struct.pack("<I", *struct.unpack(">I", raw[i:i + 4]))
                                                        for i in range(0, 16, 4)))
            found.add((addr, int(port_hex, 16)))
    return found


def command_lines(pids: list[int]) -> list[bytes]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            pass
    return out


def server_groups(guard: int) -> list[int]:
    """The process groups a seer.procs.guard started: its server's (not the sentinel it forks,
    which stays in the guard's own group)."""
    out = []
    for child in _children(guard):
        try:
            if os.getpgid(child) == child:
                out.append(child)
        except ProcessLookupError:
            continue
    return out


def guards(root: int, *needles: str) -> list[int]:
    """The seer.procs.guard processes under `root` (at any depth: under Ray they are an actor's
    children) whose command line holds every needle."""
    out = []
    for pid in process_tree(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "seer.procs.guard" in cmd and all(n in cmd for n in needles):
            out.append(pid)
    # a guard's sentinel is a fork of it, with its command line: keep the guards
    return sorted({p for p in out if _ppid(p) not in out})


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


# A CPython bytes object of 43 bytes (secrets.token_urlsafe(32), the instances' secret): its size
# (8 bytes, little-endian), its hash (8 bytes), its 43 URL-safe characters and the closing NUL.
_SECRET_BYTES = re.compile(rb"\x2b\x00{7}.{8}([A-Za-z0-9_-]{43})\x00", re.DOTALL)


def instance_secret(guard: int) -> str | None:
    """The run's instance secret, read where the server a guard runs holds it: its memory, in
    `os.environ` (root's privilege: /proc/<pid>/environ never shows it, seer.procs.secret_launch),
    confirmed by a 200 from the server's /metrics. None while it does not serve, or when no
    candidate opens it."""
    import urllib.error
    import urllib.request

    argv = Path(f"/proc/{guard}/cmdline").read_bytes().decode().split("\0")
    base = f"http://{argv[argv.index('--host') + 1]}:{argv[argv.index('--port') + 1]}"
    url = base + "/metrics"
    try:  # not serving yet: no scan (seconds of CPU) for nothing
        urllib.request.urlopen(base + "/health", timeout=5).close()
    except OSError:
        return None
    for pid in server_groups(guard):
        for candidate in _memory_candidates(pid):
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {candidate}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    if r.status == 200:
                        return candidate
            except urllib.error.HTTPError:
                continue
    return None


def _memory_candidates(pid: int, max_region: int = 256 << 20) -> list[str]:
    found: dict[str, None] = {}
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return []
    try:
        for line in maps:
            parts = line.split()
            if not parts[1].startswith("rw") or (len(parts) > 5 and parts[5] != "[heap]"):
                continue  # Python's objects live on the heap and in anonymous mappings
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if hi - lo > max_region:
                continue
            try:
                data = os.pread(fd, hi - lo, lo)
            except OSError:
                continue
            for m in _SECRET_BYTES.finditer(data):
                found.setdefault(m.group(1).decode())
    finally:
        os.close(fd)
    return list(found)
