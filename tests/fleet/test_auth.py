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
    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths])
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


def test_the_token_comes_from_the_environment_and_is_required(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    c = _app(None)
    assert c.get("/metrics", headers={"Authorization": "Bearer from-env"}).status_code == 200
    monkeypatch.delenv("VLLM_API_KEY")
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        _app(None).get("/health")


def test_the_launch_record_keeps_the_token_off_the_command_line():
    from seer.fleet.instance import InstanceSpec

    spec = InstanceSpec("i", "/m", 1234, token="s3cret", env={"SEER_DGDS_TOKEN": "dgds-s3cret"})
    assert "dgds-s3cret" not in repr(spec) and "dgds-s3cret" not in " ".join(spec.command())
    assert "s3cret" not in " ".join(spec.command()) and "s3cret" not in repr(spec)
    assert "seer.fleet.auth.RunTokenMiddleware" in spec.command()
    assert spec.environment()["VLLM_API_KEY"] == "s3cret"
    assert "VLLM_API_KEY" not in InstanceSpec("i", "/m", 1234).environment()
