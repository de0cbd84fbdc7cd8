"""CPU time of a run's processes by kind and by core, inside given time windows (benchmarks).

A background thread reads `/proc/<pid>/stat` of every process descended from the given roots
(a seer-run, a Ray node's `ray start`) a few times a second; `window_cpu` then says how many CPU
seconds each kind of process (vLLM engine, vLLM API server, Mooncake store, raylet, the Ray actor that hosts a
server, ...) spent inside windows such as an iteration's rollout phase, and on which cores it may run.
Processes of other jobs on the machine are not counted: only descendants of the roots are.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

# (kind, substring of the command line or process title); the first match names the process.
KINDS = (("vllm worker", "VLLM::Worker"), ("vllm engine", "VLLM::EngineCore"), ("vllm api", "vllm.entrypoints"), ("mooncake store", "mooncake_client"),
         ("mooncake master", "mooncake_master"), ("dgds", "seer.dgds"), ("raylet", "raylet"),
         ("gcs", "gcs_server"), ("ray trainer rank", "ray::TrainerRank"), ("ray host actor", "ray::ProcessHost"),
         ("ray agents", "dashboard"), ("ray agents", "runtime_env"), ("ray agents", "log_monitor"),
         ("ray worker", "ray::"), ("ray worker", "default_worker.py"), ("seer-run driver", "seer.cli"),
         ("ray start", "ray start"))


def kind_of(cmdline: str) -> str:
    return next((k for k, sub in KINDS if sub in cmdline), "other")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds user+system) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2:].split()
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _cmdline(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return text or Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cores(pid: int) -> str:
    try:
        return ",".join(str(c) for c in sorted(os.sched_getaffinity(pid)))
    except OSError:
        return "?"


@dataclass
class ProcCpu:
    """Samples the CPU time of the roots' descendants until `stop()`."""

    roots: list[int]
    period_s: float = 0.2
    # pid -> (kind, cores, [(monotonic t, cpu s)])
    series: dict[int, tuple[str, str, list[tuple[float, float]]]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # pid -> the start of its command line
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ProcCpu:
        self._thread = threading.Thread(target=self._run, name="proc-cpu", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _descendants(self) -> set[int]:
        parent: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
                parent[int(d.name)] = st[0]
        children: dict[int, list[int]] = {}
        for pid, pp in parent.items():
            children.setdefault(pp, []).append(pid)
        out, todo = set(), [r for r in self.roots if r in parent]
        while todo:
            pid = todo.pop()
            out.add(pid)
            todo.extend(children.get(pid, ()))
        return out

    def _run(self) -> None:
        pids: set[int] = set()
        last_scan = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_scan > 1.0:  # new processes (a vLLM engine, a store) appear within a second
                pids, last_scan = self._descendants() | {p for p in pids if Path(f"/proc/{p}").exists()}, now
                for pid in pids & self.series.keys():  # titles change after start (VLLM::EngineCore, ray::…)
                    kind, cores, pts = self.series[pid]
                    name = _cmdline(pid)
                    self.names[pid] = name[:120]
                    if (now_kind := kind_of(name)) != "other":
                        self.series[pid] = (now_kind, _cores(pid), pts)
            for pid in pids:
                st = _stat(pid)
                if st is None:
                    continue
                if pid not in self.series:
                    self.series[pid] = (kind_of(_cmdline(pid)), _cores(pid), [])
                self.series[pid][2].append((time.monotonic(), st[1]))
            self._stop.wait(self.period_s)

    def window_cpu(self, windows: list[tuple[float, float]]) -> dict[str, dict[str, float]]:
        """CPU seconds per kind and per core set spent inside the windows: {kind: {cores: s}}."""
        out: dict[str, dict[str, float]] = {}
        for kind, cores, pts in self.series.values():
            used = sum(_at(pts, b) - _at(pts, a) for a, b in windows)
            if used > 0:
                out.setdefault(kind, {}).setdefault(cores, 0.0)
                out[kind][cores] += used
        return out

    def unnamed(self, windows: list[tuple[float, float]], top: int = 5) -> list[tuple[str, float]]:
        """The command lines of the processes of kind "other" that used the most CPU in the windows."""
        used = [(self.names.get(pid, "?"), sum(_at(pts, b) - _at(pts, a) for a, b in windows))
                for pid, (kind, _, pts) in self.series.items() if kind == "other"]
        return sorted((u for u in used if u[1] > 0.01), key=lambda u: -u[1])[:top]


def _at(pts: list[tuple[float, float]], t: float) -> float:
    """The process's cumulative CPU seconds at t, linear between samples (0 before its first)."""
    if not pts or t <= pts[0][0]:
        return 0.0 if not pts or t < pts[0][0] else pts[0][1]
    for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
        if t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
    return pts[-1][1]
