"""The draft server's per-run secret: calls without it are refused, the run's launcher hands it over
in environments only, and the server listens on the host it is given only (no vLLM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seer.dgds.client.draft_client import DraftClient
from seer.dgds.server.config import TOKEN_ENV, DGDSConfig
from seer.dgds.server.grpc_server import SERVICE_NAME, DgdsServer
from seer.dgds.wire import auth_metadata
from seer.dgds.proto import dgds_pb2 as pb
from seer.dgds.proto import dgds_pb2_grpc as pb_grpc
from seer.dgds.server.service import DGDSService, DGDSStartError
from seer.dgds.types import DraftParams, SpeculateRow

SECRET = "s3cret-for-this-test-only"
LOCAL = {"127.0.0.1", "::ffff:127.0.0.1"}


@dataclass(frozen=True)
class FakeSpec:  # the part of an InstanceSpec that DGDSService.configure reads
    extra_args: tuple = ()
    env: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def server():
    srv = DgdsServer("127.0.0.1", 0, token=SECRET).start()
    yield srv
    srv.stop(0)


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code()


@pytest.mark.parametrize("metadata", [(), auth_metadata("wrong"), (("authorization", SECRET),)],
                         ids=["none", "wrong", "not-bearer"])
def test_calls_without_the_secret_are_unauthenticated(server, metadata):
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.DraftServerStub(ch)
        register = pb.RegisterGroupRequest(group_id="g", ttl_seconds=30)
        assert _code(lambda: stub.RegisterGroup(register, timeout=5, metadata=metadata)) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: stub.GetMetrics(pb.GetMetricsRequest(), timeout=5, metadata=metadata)) == \
            grpc.StatusCode.UNAUTHENTICATED
        stream = stub.SyncStream(iter([pb.SyncRequest()]), timeout=5, metadata=metadata)
        assert _code(lambda: next(stream)) == grpc.StatusCode.UNAUTHENTICATED
        # liveness probes need no secret
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
        assert h.status == health_pb2.HealthCheckResponse.SERVING
    assert server.store.stats()["groups"] == 0  # nothing of the refused calls was applied


def test_the_right_secret_works_and_the_client_sends_it_from_the_environment(server, monkeypatch):
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.DraftServerStub(ch)
        md = auth_metadata(SECRET)
        assert stub.RegisterGroup(pb.RegisterGroupRequest(group_id="direct", ttl_seconds=30), timeout=5, metadata=md).max_depth
        [resp] = stub.SyncStream(iter([pb.SyncRequest(group_ids=["direct"], request_ids=["r"], append_group=[0],
                                                      append_prev=[0], append_len=[1], tokens=b"\x07\x00\x00\x00")]),
                                 timeout=5, metadata=md)
        assert resp.append_status == bytes([pb.APPLIED]) and list(resp.committed) == [1]
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    with DraftClient(server.address, update_batch_tokens=1, fetch_interval_s=0.02) as c:
        c.register_group("g", 30)
        c.append("g", "r", [1, 2, 3, 1, 2])
        assert c.sync(5) and c.stats().rpc_errors == 0
        assert c.batch_speculate([SpeculateRow("r", "g", [1], DraftParams(max_spec_tokens=2))])[0].tokens == (2, 3)
    monkeypatch.setenv(TOKEN_ENV, "wrong")
    with DraftClient(server.address, fetch_interval_s=0.02, rpc_timeout_s=0.5) as c:
        c.register_group("g2", 30)
        c.append("g2", "r", [1, 2])
        assert not c.sync(0.5) and c.stats().rpc_errors > 0


def _serve(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "seer.dgds.server.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_cli_takes_the_secret_from_env_or_file_and_refuses_to_start_without_one(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc = _serve([], env)
    assert proc.wait(timeout=30) != 0 and TOKEN_ENV in proc.stderr.read()  # no secret, no --insecure
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    for args, extra in (([], {TOKEN_ENV: SECRET}), (["--token-file", str(token_file)], {})):
        proc = _serve(args, {**env, **extra})
        try:
            line = proc.stdout.readline()
            assert "serving on 127.0.0.1:" in line and SECRET not in line, line + proc.stderr.read()
            assert SECRET.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            address = line.rsplit(" ", 1)[1].strip()
            with grpc.insecure_channel(address) as ch:
                stub = pb_grpc.DraftServerStub(ch)
                assert _code(lambda: stub.GetMetrics(pb.GetMetricsRequest(), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
                stub.GetMetrics(pb.GetMetricsRequest(), timeout=5, metadata=auth_metadata(SECRET))
        finally:
            _stop(proc)
    proc = _serve(["--insecure"], env)
    try:
        line = proc.stdout.readline()
        assert "--insecure" in line and "serving on 127.0.0.1:" in line, line + proc.stderr.read()
        with grpc.insecure_channel(line.rsplit(" ", 1)[1].strip()) as ch:
            pb_grpc.DraftServerStub(ch).GetMetrics(pb.GetMetricsRequest(), timeout=5)
    finally:
        _stop(proc)


def test_launched_server_gets_a_fresh_secret_on_a_pipe_not_in_an_exec_environment_or_command_line(tmp_path: Path,
                                                                                                  monkeypatch):
    import psutil  # a declared dependency (pyproject.toml): its absence is a failure, not a skip

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    cfg = DGDSConfig(enabled=True, host="127.0.0.1", ready_timeout_s=60)
    with DGDSService.start(cfg, tmp_path) as svc, DGDSService.start(cfg, tmp_path / "second") as other:
        token = svc._token
        assert token and len(token) >= 40 and token != other._token  # token_urlsafe(32), one per run
        guard = psutil.Process(svc.process.proc.pid)
        procs = [guard, *guard.children(recursive=True)]
        assert len(procs) >= 3  # the guard, its sentinel and the server
        for p in procs:  # read as root: what /proc shows of each (seer.procs.secret_launch)
            assert token not in " ".join(p.cmdline())
            assert token not in " ".join(p.environ().values()) and TOKEN_ENV not in p.environ()
        port = int(svc.address.rsplit(":", 1)[1])
        listening = {(c.laddr.ip, c.laddr.port) for p in procs for c in p.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN}
        bound = {ip for ip, _ in listening}
        assert bound and bound <= LOCAL, bound  # only the host it was given, not 0.0.0.0 or ::
        assert len({p for _, p in listening}) == 2 and port in {p for _, p in listening}  # gRPC and the sync lane
        with grpc.insecure_channel(svc.address) as ch:
            stub = pb_grpc.DraftServerStub(ch)
            assert _code(lambda: stub.GetMetrics(pb.GetMetricsRequest(), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
            stub.GetMetrics(pb.GetMetricsRequest(), timeout=5, metadata=auth_metadata(token))

        spec = svc.configure(FakeSpec())
        assert spec.env[TOKEN_ENV] == token and spec.env["SEER_DGDS_ADDRESS"] == svc.address
        assert token not in " ".join(spec.extra_args)
        assert token not in (tmp_path / "dgds.log").read_text()
        # a run that joins this server (dgds.address) takes the secret from its own environment
        joined = DGDSConfig(enabled=True, address=svc.address, ready_timeout_s=10)
        with pytest.raises(DGDSStartError, match="UNAUTHENTICATED"):
            DGDSService.start(joined, tmp_path / "joined")
        monkeypatch.setenv(TOKEN_ENV, token)
        with DGDSService.start(joined, tmp_path / "joined") as j:
            assert j.configure(FakeSpec()).env[TOKEN_ENV] == token
