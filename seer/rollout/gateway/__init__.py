"""The OpenAI-compatible agent gateway: its server, its sessions, and the rollout function that serves it
(docs/agents-gateway.md). Imports lazily: the run config imports this package's config section."""

from __future__ import annotations

from typing import Any

_WHERE = {
    "ApiError": "core", "Gateway": "core", "GatewayLimits": "core", "GatewayTurns": "core",
    "GatewayConfig": "config",
    "gateway_rollout": "rollout", "GatewayServer": "server", "build_app": "server",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"seer.rollout.gateway.{_WHERE[name]}"), name)


__all__ = sorted(_WHERE)
