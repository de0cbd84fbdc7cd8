"""Weight synchronisation with running vLLM instances, without restarting them.

After each training step the trainer writes the new weights as an HF safetensors directory;
every instance loads it in place (seer.fleet.weight_ext via /collective_rpc), drops its
prefix cache (KV computed by the old policy must not be reused), and reports the version.
On one machine a shared directory is the transfer; clusters would swap in NCCL broadcast.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from seer.fleet.client import InstanceClient, InstanceError

WORKER_EXTENSION = "seer.fleet.weight_ext.SeerWeightExtension"
# /collective_rpc and /reset_prefix_cache exist only in vLLM's dev mode
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
SERVER_ARGS = ("--worker-extension-cls", WORKER_EXTENSION)


class StaleWeightsError(RuntimeError):
    """An instance serves weights older than the trainer's: rollout would be off-policy."""


async def _post(client: InstanceClient, path: str, body: dict | None, timeout_s: float) -> dict | None:
    session = await client._http()
    async with session.post(f"{client.base_url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        text = await r.text()
        if r.status >= 400:
            raise InstanceError(f"{client.name}: POST {path} failed ({r.status}): {text[:500]}")
        return await r.json(content_type=None) if text.strip() else None


async def rpc(client: InstanceClient, method: str, *args: str, timeout_s: float = 600.0) -> list:
    out = await _post(client, "/collective_rpc", {"method": method, "args": list(args), "timeout": timeout_s}, timeout_s)
    return (out or {}).get("results", [])


async def weight_version(client: InstanceClient) -> int:
    """The version every worker of the instance serves (they must agree)."""
    results = await rpc(client, "seer_weight_version", timeout_s=30)
    versions = {int(v) for v in results}
    if len(versions) != 1:
        raise StaleWeightsError(f"{client.name}: workers disagree on the weight version: {sorted(versions)}")
    return versions.pop()


async def push_weights(clients: list[InstanceClient], path: str, version: int, *, kv_pool: bool = False) -> None:
    """Load `path` into every instance at once, then drop their prefix caches (and the pool's)."""

    async def one(c: InstanceClient) -> None:
        results = await rpc(c, "seer_load_weights", str(path), str(version))
        if {int(v) for v in results} != {version}:
            raise StaleWeightsError(f"{c.name}: loaded version {results}, expected {version}")
        if not await _reset(c, external=False):
            raise InstanceError(f"{c.name}: could not drop the prefix cache after the weight update "
                                f"(still refused after {RESET_RETRY_S:.0f} s)")

    await asyncio.gather(*(one(c) for c in clients))
    if kv_pool and not await _reset(clients[0], external=True):
        raise InstanceError(f"could not clear the KV pool after the weight update (still refused after "
                            f"{RESET_RETRY_S:.0f} s)")


# vLLM refuses a reset while blocks are in use, as by KV transfers still pending to a store lost with
# its node (until Mooncake gives up on them, and the master forgets the store after client_ttl).
RESET_RETRY_S = 30.0


async def _reset(c: InstanceClient, external: bool) -> bool:
    deadline = time.monotonic() + RESET_RETRY_S
    while not await c.reset_prefix_cache(external=external):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
    return True


async def require_version(clients: list[InstanceClient], version: int) -> None:
    """Refuse to roll out while any instance serves other weights than `version`."""
    found = dict(zip([c.name for c in clients], await asyncio.gather(*(weight_version(c) for c in clients))))
    stale = {n: v for n, v in found.items() if v != version}
    if stale:
        raise StaleWeightsError(
            f"refusing to start rollout for weight version {version}: instances serve {stale}"
        )
