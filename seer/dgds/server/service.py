"""The DGDS as part of a run: launch (or join) the draft server and enable the proposer on instances.

Off by default: on one CPU core the extra verification work costs more than accepted drafts save
(docs/dgds.md). Sampled outputs stay exact under speculation (the proposer applies
seer.compat.vllm_cpu_fixes), so turning it on never changes what the policy would have produced.

Each launched server gets a fresh secret (``secrets.token_urlsafe(32)``), handed to it and to every
instance as ``SEER_DGDS_TOKEN`` on a pipe into its ``os.environ`` (seer.procs.secret_launch), never
in an exec environment, on a command line, in a log or in config.yaml; a joined server (``dgds.address``) is called with ``SEER_DGDS_TOKEN`` from seer-run's
own environment.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seer.dgds.server.config import TOKEN_ENV, DGDSConfig
from seer.dgds.vllm import EXECUTOR_ARGS, speculative_config
from seer.types import LaunchSpec
from seer.procs import free_port
from seer.procs import GuardedProcess


class DGDSStartError(RuntimeError):
    """The draft server did not come up; carries its log tail."""


def wait_serving(address: str, timeout_s: float) -> bool:
    """True once the server's grpc.health.v1 check answers SERVING."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.3)
    return False


def check_token(address: str, token: str | None) -> None:
    """Raise DGDSStartError if the server refuses ``token`` (one GetMetrics call)."""
    from seer.dgds.wire import auth_metadata
    from seer.dgds.proto import dgds_pb2 as pb
    from seer.dgds.proto import dgds_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as ch:
        try:
            pb_grpc.DraftServerStub(ch).GetMetrics(pb.GetMetricsRequest(), timeout=10, metadata=auth_metadata(token))
        except grpc.RpcError as e:
            hint = f" (is {TOKEN_ENV} set to its secret?)" if e.code() == grpc.StatusCode.UNAUTHENTICATED else ""
            raise DGDSStartError(f"DGDS at {address} refused a call: {e.code().name}{hint}") from None


class DGDSService:
    def __init__(self, config: DGDSConfig, address: str | None, process=None, token: str | None = None):
        self.config = config
        self.address = address
        self.process = process
        self._token = token  # the run's secret: only ever passed on through a pipe (seer.procs.secret_launch)

    @classmethod
    def start(cls, config: DGDSConfig, log_dir: str | Path) -> DGDSService:
        if not config.enabled:
            return cls(config, None)
        if config.address is not None:
            if not wait_serving(config.address, config.ready_timeout_s):
                raise DGDSStartError(f"DGDS at {config.address} does not answer health checks")
            token = os.environ.get(TOKEN_ENV) or None
            check_token(config.address, token)
            return cls(config, config.address, token=token)
        port = free_port(config.host)
        token = secrets.token_urlsafe(32)
        proc = GuardedProcess(
            "seer-dgds",
            [sys.executable, "-m", "seer.dgds.server.cli", "serve", "--host", config.host, "--port", str(port),
             "--max-depth", str(config.max_depth), "--log-level", "WARNING"],
            Path(log_dir) / "dgds.log",
            secrets={TOKEN_ENV: token},
        )
        proc.start()
        service = cls(config, f"{config.host}:{port}", proc, token)
        if not wait_serving(service.address, config.ready_timeout_s):
            tail = proc.log_tail()
            service.close()
            raise DGDSStartError(f"seer-dgds did not become ready on {service.address}; log:\n{tail}")
        return service

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def configure(self, spec: LaunchSpec) -> LaunchSpec:
        """`spec` with the grouped-draft proposer enabled (unchanged when DGDS is off)."""
        if not self.enabled:
            return spec
        c = self.config
        flag = speculative_config(c.num_speculative_tokens)
        env = {"SEER_DGDS_ADDRESS": self.address, "SEER_DGDS_MODE": c.mode, "SEER_DGDS_ADAPTIVE": "1" if c.adaptive else "0"}
        if self._token:
            env[TOKEN_ENV] = self._token
        # EXECUTOR_ARGS: the drafts ride on the step's output instead of a per-step RPC (docs/dgds.md)
        return replace(spec, extra_args=(*spec.extra_args, "--speculative-config", flag, *EXECUTOR_ARGS),
                       env={**env, **spec.env})

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def __enter__(self) -> DGDSService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
