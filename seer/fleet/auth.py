"""Every route of a Seer-launched vLLM server behind the run's secret, not only vLLM's `/v1` ones.

vLLM's own `--api-key` / `VLLM_API_KEY` check guards `/v1`-style routes only, while the dev-mode
routes Seer relies on (`/collective_rpc`, which loads weights from a path; `/reset_prefix_cache`)
and `/metrics` stay open to anyone who can reach the port. This ASGI middleware, loaded into the
server with `--middleware seer.fleet.auth.RunTokenMiddleware`, refuses any request but `/health`
(a liveness probe that tells nothing) without `Authorization: Bearer <VLLM_API_KEY>`, whatever its
method: an OPTIONS request (a CORS preflight) is refused like a GET, as a browser's preflight carries
no secret and no Seer client sends one. The secret comes from the server's environment, never its
command line, which any local user can read.

Imported inside the vLLM server: it loads nothing of Seer's.
"""

from __future__ import annotations

import hashlib
import hmac
import os

TOKEN_ENV = "VLLM_API_KEY"
OPEN_PATHS = ("/health",)


class RunTokenMiddleware:
    def __init__(self, app, token: str | None = None) -> None:
        self.app = app
        token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        if not token:
            raise RuntimeError(f"RunTokenMiddleware needs the run's secret in {TOKEN_ENV}")
        self._digest = hashlib.sha256(token.encode()).digest()

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(token.encode()).digest(), self._digest)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):  # lifespan: no request
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS or self._authorized(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"error": "Unauthorized"}'})
