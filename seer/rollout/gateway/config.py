"""The gateway's config section (the agents' is seer.rollout.agents.AgentConfig) (light: the run config imports them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayConfig:
    """The `gateway` section: where the server listens and what one request may weigh."""

    host: str | None = None  # None: the driver's cluster address (cluster.node_ip), as the KV master's
    port: int | None = None  # None: a free port, named to each agent in its base URL
    max_request_bytes: int = 4 << 20  # a request body past this is refused (413) before it is parsed
    model_name: str = "seer-policy"  # the one model /v1/models lists and every call must name

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if self.port is not None and not 0 < self.port < 65536:
            out.append(("gateway.port", f"must be in 1..65535 (or null: a free port), got {self.port}"))
        if self.max_request_bytes < 1024:
            out.append(("gateway.max_request_bytes", f"must be >= 1024, got {self.max_request_bytes}"))
        if not self.model_name:
            out.append(("gateway.model_name", "must be non-empty"))
        return out

