"""Where processes run: free ports, the cores or GPUs each instance gets, the OpenMP library.

Ground layer: every package that launches a process (fleet, KV pool, DGDS) uses these.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path


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


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections there (a server we started is up)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


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
