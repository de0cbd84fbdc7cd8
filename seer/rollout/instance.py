"""Launch one vLLM OpenAI-compatible server as a child process.

The wheel's `vllm serve` console script fails on the CPU build (package metadata), so the
server runs as `python -m vllm.entrypoints.openai.api_server`. Each instance is pinned to its
own CPU cores (or GPUs), so an idle instance is idle hardware, as on a cluster.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from seer.rollout import weights
from seer.rollout.process import GuardedProcess


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
    # "priority" (vLLM's priority scheduling) lets a policy that ranks its chunks
    # (scheduler.engine_priority) choose which a full engine preempts; the loop sets it with that option.
    scheduling_policy: str = "fcfs"

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
            "--scheduling-policy", self.scheduling_policy,
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
    return _split(num_instances, sorted(cpus if cpus is not None else os.sched_getaffinity(0)), "CPU core")


def gpu_sets(num_instances: int, gpus: list[int]) -> list[str]:
    """Split the visible GPUs evenly into one CUDA_VISIBLE_DEVICES list per instance (TP within it)."""
    return _split(num_instances, sorted(gpus), "GPU")


def cuda_devices() -> list[int]:
    """The GPUs this process sees; [] on a CPU-only machine (the CPU torch build has no CUDA)."""
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def _split(num_instances: int, units: list[int], what: str) -> list[str]:
    if num_instances < 1:
        raise ValueError("instances.count must be >= 1")
    if num_instances > len(units):
        raise ValueError(
            f"instances.count={num_instances} needs at least one {what} each, but only {len(units)} are usable"
        )
    per = len(units) // num_instances
    return [",".join(str(c) for c in units[i * per:(i + 1) * per]) for i in range(num_instances)]


class VLLMServer(GuardedProcess):
    """One vLLM server under seer.rollout.guard, with its spec."""

    def __init__(self, spec: InstanceSpec, log_path: Path):
        # The whole server, not only its OpenMP threads, stays on the instance's cores (CPU backend).
        super().__init__(spec.name, spec.command(), log_path, spec.environment(), inherit_env=False,
                         cpus=spec.cpus if spec.gpus is None else None)
        self.spec = spec
