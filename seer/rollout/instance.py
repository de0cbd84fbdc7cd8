"""Launch one vLLM OpenAI-compatible server as a child process.

The wheel's `vllm serve` console script fails on the CPU build (package metadata), so the
server runs as `python -m vllm.entrypoints.openai.api_server`. Each instance is pinned to its
own CPU cores (or GPUs), so an idle instance is idle hardware, as on a cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from seer.rollout import weights


class InstanceStartError(RuntimeError):
    """A vLLM server exited or did not become ready; carries the tail of its log."""


@dataclass(frozen=True)
class InstanceSpec:
    name: str
    model: str
    port: int
    host: str = "127.0.0.1"
    cpus: str | None = None  # OpenMP core list for the CPU backend, e.g. "0" or "2-3"
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES on GPU clusters
    dtype: str = "float32"
    max_model_len: int = 4096
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 256
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    weight_sync: bool = True  # load new weights in place (seer.rollout.weights) and report versions

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", "seer-policy",
            "--host", self.host,
            "--port", str(self.port),
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--seed", str(self.seed),
            "--enable-prompt-tokens-details",
            "--disable-uvicorn-access-log",
        ]
        if self.kv_cache_bytes:
            cmd += ["--kv-cache-memory-bytes", str(int(self.kv_cache_bytes))]
        if self.weight_sync:
            cmd += list(weights.SERVER_ARGS)
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        iomp = intel_openmp_library()
        if iomp and iomp not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = ":".join(p for p in (iomp, env.get("LD_PRELOAD", "")) if p)
        if self.cpus is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpus
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if self.weight_sync:
            env.update(weights.SERVER_ENV)
        env.update(self.env)
        return env


def intel_openmp_library() -> str | None:
    """The venv's libiomp5.so: vLLM's CPU backend expects Intel OpenMP preloaded."""
    for base in (Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"):
        p = base / "libiomp5.so"
        if p.exists():
            return str(p)
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_sets(num_instances: int, cpus: list[int] | None = None) -> list[str]:
    """Split the usable cores evenly into one contiguous set per instance."""
    cores = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if num_instances < 1:
        raise ValueError("instances.count must be >= 1")
    if num_instances > len(cores):
        raise ValueError(
            f"instances.count={num_instances} needs at least one CPU core each, but only {len(cores)} are usable"
        )
    per = len(cores) // num_instances
    return [",".join(str(c) for c in cores[i * per:(i + 1) * per]) for i in range(num_instances)]


class VLLMServer:
    """One running server (under seer.rollout.guard), its log file, and how to stop it."""

    def __init__(self, spec: InstanceSpec, log_path: Path):
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "seer.rollout.guard", str(os.getpid()), "--", *self.spec.command()]
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.spec.environment(), start_new_session=True,
        )
        log.close()
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the guard, which takes the server's process group down."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """Hard kill (fault injection): the guard sees nothing, so kill the server group too."""
        if self.proc is None:
            return
        import signal

        for pid in _group_members(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


def _group_members(guard_pid: int) -> list[int]:
    """Pids whose process-group leader is a child of the guard (the vLLM server tree)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid, pgid = int(stat[1]), int(stat[2])
        if ppid == guard_pid or _parent_of(pgid) == guard_pid:
            out.append(int(d.name))
    return out


def _parent_of(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
