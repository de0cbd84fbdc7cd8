"""Launch one vLLM OpenAI-compatible server as a child process.

The wheel's `vllm serve` console script fails on the CPU build (package metadata), so the
server runs as `python -m vllm.entrypoints.openai.api_server`. Each instance is pinned to its
own CPU cores (or GPUs), so an idle instance is idle hardware, as on a cluster.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from seer.fleet import weights
from seer.fleet.config import InstancesConfig
from seer.procs import GuardedProcess, intel_openmp_library
from seer.procs.environment import RUN_SECRETS, inherited


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
    max_num_seqs: int = InstancesConfig.max_num_seqs
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)  # may carry secrets (SEER_DGDS_TOKEN)
    weight_sync: bool = True  # load new weights in place (seer.fleet.weights) and report versions
    # "priority" (vLLM's priority scheduling) lets a policy that ranks its chunks
    # (scheduler.engine_priority) choose which a full engine preempts; the loop sets it with that option.
    scheduling_policy: str = "fcfs"
    # The run's secret: every route but /health needs it (seer.fleet.auth). It reaches the server's
    # os.environ through a pipe (secrets()), never its exec environment or command line; None leaves
    # the server open (tests, benches).
    token: str | None = field(default=None, repr=False)

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
        if self.token:
            cmd += ["--middleware", "seer.fleet.auth.RunTokenMiddleware"]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        """The server's whole exec environment: the allow-listed part of ours (seer.procs.environment:
        no WANDB_API_KEY or other secret of the driver's), then the instance's own settings, without
        a secret (those are `secrets()`)."""
        env = inherited()
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
        env.update({k: v for k, v in self.env.items() if k not in RUN_SECRETS})
        return env

    def secrets(self) -> dict[str, str]:
        """What the server reads from os.environ but gets on a pipe (seer.procs.secret_launch): the
        run's key (vLLM's /v1 check and seer.fleet.auth's for the rest) and the DGDS secret."""
        out = {k: v for k, v in self.env.items() if k in RUN_SECRETS}
        out.pop("VLLM_API_KEY", None)
        if self.token:
            out["VLLM_API_KEY"] = self.token
        return out


class VLLMServer(GuardedProcess):
    """One vLLM server under seer.procs.guard, with its spec."""

    def __init__(self, spec: InstanceSpec, log_path: Path):
        # The whole server, not only its OpenMP threads, stays on the instance's cores (CPU backend).
        super().__init__(spec.name, spec.command(), log_path, spec.environment(), inherit_env=False,
                         cpus=spec.cpus if spec.gpus is None else None, secrets=spec.secrets())
        self.spec = spec
