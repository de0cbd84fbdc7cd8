"""seer.fleet.auth: every route but /health needs the run's secret (vLLM's own key guards /v1 only)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from seer.fleet.auth import RunTokenMiddleware


def _app(token):
    async def ok(request):
        return PlainTextResponse("ok")

    paths = ["/health", "/v1/completions", "/collective_rpc", "/reset_prefix_cache", "/metrics"]
    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST", "OPTIONS"]) for p in paths])
    app.add_middleware(RunTokenMiddleware, token=token)
    return TestClient(app)


@pytest.mark.parametrize("path", ["/v1/completions", "/collective_rpc", "/reset_prefix_cache", "/metrics"])
def test_every_route_but_health_needs_the_token(path):
    c = _app("s3cret")
    assert c.post(path).status_code == 401
    assert c.post(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.post(path, headers={"Authorization": "Basic s3cret"}).status_code == 401
    assert c.post(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/health").status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/collective_rpc", "/metrics"])
def test_options_needs_the_token_too_except_on_health(path):
    c = _app("s3cret")
    assert c.options(path).status_code == 401
    assert c.options(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.options("/health").status_code == 200


def test_the_token_comes_from_the_environment_and_is_required(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    c = _app(None)
    assert c.get("/metrics", headers={"Authorization": "Bearer from-env"}).status_code == 200
    monkeypatch.delenv("VLLM_API_KEY")
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        _app(None).get("/health")


def test_the_launch_record_keeps_the_token_off_the_command_line_and_out_of_the_exec_environment(monkeypatch):
    from seer.fleet.instance import InstanceSpec

    spec = InstanceSpec("i", "/m", 1234, token="s3cret", env={"SEER_DGDS_TOKEN": "dgds-s3cret"})
    assert "dgds-s3cret" not in repr(spec) and "dgds-s3cret" not in " ".join(spec.command())
    assert "s3cret" not in " ".join(spec.command()) and "s3cret" not in repr(spec)
    assert "seer.fleet.auth.RunTokenMiddleware" in spec.command()
    # the secrets go on a pipe (seer.procs.secret_launch), not in what /proc/<pid>/environ shows
    assert spec.secrets() == {"VLLM_API_KEY": "s3cret", "SEER_DGDS_TOKEN": "dgds-s3cret"}
    assert not {"VLLM_API_KEY", "SEER_DGDS_TOKEN"} & set(spec.environment())
    monkeypatch.setenv("VLLM_API_KEY", "drivers-own")  # an attached fleet's key in seer-run's environment
    assert "VLLM_API_KEY" not in InstanceSpec("i", "/m", 1234).environment()
    assert InstanceSpec("i", "/m", 1234).secrets() == {}


def test_a_server_inherits_only_the_allow_listed_environment(monkeypatch):
    """A secret of the driver's (WANDB_API_KEY, a cloud token) never reaches a vLLM server; what its
    runtimes read (PATH, OpenMP, vLLM's and Seer's own variables) does."""
    from seer.fleet.instance import InstanceSpec

    for k, v in {"WANDB_API_KEY": "w", "AWS_SECRET_ACCESS_KEY": "a", "RAY_AUTH_TOKEN_PATH": "/t",
                 "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "SEER_DGDS_PURE_PYTHON": "1",
                 "LC_ALL": "C", "PYTHONPATH": "/p", "MC_LOG_LEVEL": "x"}.items():
        monkeypatch.setenv(k, v)
    env = InstanceSpec("i", "/m", 1234, token="s3cret", env={"SEER_DGDS_TOKEN": "d"}).environment()
    assert not {"WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "RAY_AUTH_TOKEN_PATH"} & set(env)
    assert {"PATH", "OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE", "SEER_DGDS_PURE_PYTHON", "LC_ALL", "PYTHONPATH",
            "MC_LOG_LEVEL"} <= set(env)
    assert "SEER_DGDS_TOKEN" not in env and "VLLM_API_KEY" not in env  # handed on a pipe instead
