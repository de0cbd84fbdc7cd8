"""Async token-in/token-out client for one vLLM OpenAI-compatible server.

RL needs exact token ids and their logprobs (re-tokenising text is lossy), so requests carry
prompt token ids and ask for `return_token_ids`. Aborting is cancelling: vLLM aborts a request
whose HTTP connection closes, so `abort()` cancels the in-flight call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import aiohttp

from seer.types import Telemetry
from seer.procs.vllm_metrics import telemetry_from_metrics
from seer.types import GenerateRequest, GenerateResult, Routing, SamplingParams


KEEPALIVE_S = 2.0  # below vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s)
# A /health probe's first wait; a server that has not answered by then is asked again for
# HEALTH_RECHECK_S before the fleet drops it (a process that is gone refuses at once).
HEALTH_TIMEOUT_S = 5.0
HEALTH_RECHECK_S = 30.0


class InstanceError(RuntimeError):
    """The instance rejected a request (a bug in the request, not a transient fault)."""


class InstanceUnavailable(ConnectionError):
    """The instance could not be reached or died while serving."""


class InstanceClient:
    """One vLLM server reached over HTTP; implements seer.types.InstanceBackend."""

    def __init__(self, name: str, base_url: str, model: str | None = None, request_timeout_s: float = 3600.0,
                 token: str | None = None):
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.model = model
        # The run's secret (seer.fleet.auth), sent on every request; None for an open server.
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._inflight: dict[str, asyncio.Task] = {}
        # Routing replay: the instance's capture header ({layers, top_k, dtype, num_experts}) once
        # `enable_routing` turned capture on; every finished chunk then takes its routing back.
        self.routing: dict | None = None
        self.routing_fetch_s = 0.0  # time spent taking routing back (the per-chunk round trips)
        self.routing_fetch_bytes = 0  # what those round trips carried (base64 JSON)

    async def _http(self) -> aiohttp.ClientSession:
        # A session belongs to one event loop; each asyncio.run() (one per iteration) gets its own.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            # Idle connections are dropped before the server's keep-alive (vLLM/uvicorn: 5 s) closes
            # them: reusing one the server is closing fails with "connection reset by peer", which
            # on a loaded machine dropped a healthy instance from a rollout (chunk and health probe
            # both sent on stale connections).
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, headers=self._headers,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            )
            self._session_loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def served_model(self) -> str:
        """The model name the server registered (needed in every completion request)."""
        if self.model is None:
            async with (await self._http()).get(f"{self.base_url}/v1/models") as r:
                data = await r.json()
            self.model = data["data"][0]["id"]
        return self.model

    def _payload(self, req: GenerateRequest, model: str) -> dict:
        sp = req.sampling
        body = {
            "model": model,
            "prompt": list(req.prompt_ids),
            "max_tokens": int(req.max_tokens),
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if req.logprobs:
            body["logprobs"] = 0
        if sp.seed is not None:
            body["seed"] = int(sp.seed)
        if sp.ignore_eos:
            body["ignore_eos"] = True
        if req.priority:
            body["priority"] = int(req.priority)
        if req.stop:
            body["stop"] = list(req.stop)
            body["include_stop_str_in_output"] = True
        if req.cache_salt:
            body["cache_salt"] = req.cache_salt
        return body

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        task = asyncio.ensure_future(self._generate(req))
        self._inflight[req.request_id] = task
        try:
            return await task
        except asyncio.CancelledError:
            if task.cancelled():  # aborted through abort(): report, don't propagate
                now = time.time()
                return GenerateResult(req.request_id, [], [], "abort", 0, len(req.prompt_ids), self.name, now, now)
            raise
        finally:
            self._inflight.pop(req.request_id, None)

    async def _generate(self, req: GenerateRequest) -> GenerateResult:
        model = await self.served_model()
        start = time.time()
        try:
            async with (await self._http()).post(
                f"{self.base_url}/v1/completions",
                json=self._payload(req, model),
                headers={"X-Request-Id": req.request_id},
            ) as r:
                data = await r.json(content_type=None)
                if r.status >= 400:
                    msg = data.get("error", data) if isinstance(data, dict) else data
                    if isinstance(msg, dict):
                        msg = msg.get("message", msg)
                    if req.priority and "priority" in str(msg).lower():
                        msg = (f"{msg} (the scheduler sends engine priorities: start the instance with "
                               "--scheduling-policy priority, or set scheduler.engine_priority: false)")
                    raise InstanceError(f"{self.name}: request {req.request_id} rejected ({r.status}): {msg}")
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            raise InstanceUnavailable(f"{self.name} at {self.base_url}: {e!r}") from e
        choice = data["choices"][0]
        token_ids = list(choice.get("token_ids") or [])
        logprobs = []
        if req.logprobs and choice.get("logprobs"):
            logprobs = [float(x) if x is not None else 0.0 for x in choice["logprobs"]["token_logprobs"]]
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        finish = choice.get("finish_reason") or "stop"
        routing, routing_start = (None, 0)
        if self.routing is not None and token_ids:
            routing, routing_start = await self._take_routing(req.request_id)
        return GenerateResult(
            request_id=req.request_id,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason="length" if finish == "length" else ("abort" if finish == "abort" else "stop"),
            cached_prefix_tokens=int(details.get("cached_tokens") or 0),
            prompt_tokens=int(usage.get("prompt_tokens") or len(req.prompt_ids)),
            instance=self.name,
            start_time=start,
            finish_time=time.time(),
            routing=routing,
            routing_start=routing_start,
        )

    # ---- routing replay (seer.fleet.routing_ext in the instance's worker) -------------------------
    async def _rpc(self, method: str, *args: str, timeout_s: float = 60.0) -> list:
        async with (await self._http()).post(
            f"{self.base_url}/collective_rpc", json={"method": method, "args": list(args), "timeout": timeout_s},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as r:
            text = await r.text()
            if r.status >= 400:
                raise InstanceError(f"{self.name}: {method} failed ({r.status}): {text[:1000]}")
        self.routing_fetch_bytes += len(text)
        return [x for x in (json.loads(text) if text.strip() else {}).get("results", []) if x]

    async def enable_routing(self, cap_bytes: int = 0) -> dict:
        """Turn the instance's routing capture on (needs `--enforce-eager`: a compiled model never
        calls the capture hook); returns and keeps its header. Raises for a dense model."""
        results = await self._rpc("seer_routing_enable", str(int(cap_bytes)))
        if not results:
            raise InstanceError(f"{self.name}: no worker answered seer_routing_enable")
        self.routing = json.loads(results[0])
        # a probe: a compiled model (no --enforce-eager) never calls the hook and records nothing
        probe = await self.generate(GenerateRequest(f"seer-routing-probe-{self.name}", [1, 2, 3], 2,
                                                    SamplingParams(temperature=0.0), logprobs=False))
        if probe.routing is None or probe.routing.num_tokens < 1:
            self.routing = None
            raise InstanceError(f"{self.name}: routing capture recorded nothing for a probe request; the "
                                "instance must run its model eagerly (vLLM's --enforce-eager)")
        return self.routing

    async def _take_routing(self, request_id: str) -> tuple[Routing | None, int]:
        """The rows the instance recorded for `request_id` (popped there), or (None, 0) when it has
        none (the driver then recomputes them: seer.scheduler.routing)."""
        t0 = time.perf_counter()
        try:
            results = await self._rpc("seer_routing_take", json.dumps([request_id]))
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError, InstanceError):
            return None, 0
        finally:
            self.routing_fetch_s += time.perf_counter() - t0
        if not results:
            return None, 0
        d = json.loads(results[0])
        got = d["requests"].get(request_id)
        if got is None:
            return None, 0
        return Routing(int(d["layers"]), int(d["top_k"]), d["dtype"], base64.b64decode(got["data"])), int(got["start"])

    async def abort(self, request_id: str) -> None:
        task = self._inflight.get(request_id)
        if task is not None and not task.done():
            task.cancel()

    async def reset_prefix_cache(self, *, external: bool = False) -> bool:
        """Drop the instance's local prefix cache; with `external`, the KV pool's contents too.

        KV computed by old weights must never be reused after a weight update; tests also use the
        local-only form to make an instance forget a request so that its prefix must come from the
        pool. Needs the server in vLLM's dev mode (VLLM_SERVER_DEV_MODE=1).
        """
        url = f"{self.base_url}/reset_prefix_cache?reset_external={'true' if external else 'false'}"
        async with (await self._http()).post(url) as r:
            if r.status >= 400:
                return False
            data = await r.json(content_type=None)
        return bool(data.get("success", True)) if isinstance(data, dict) else True

    async def metrics_text(self) -> str:
        try:
            async with (await self._http()).get(f"{self.base_url}/metrics") as r:
                return await r.text()
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            raise InstanceUnavailable(f"{self.name} at {self.base_url}: {e!r}") from e

    async def telemetry(self) -> Telemetry:
        return telemetry_from_metrics(self.name, await self.metrics_text())

    async def healthy(self, timeout_s: float | None = None) -> bool:
        wait = aiohttp.ClientTimeout(total=timeout_s or HEALTH_TIMEOUT_S)
        try:
            async with (await self._http()).get(f"{self.base_url}/health", timeout=wait) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False
