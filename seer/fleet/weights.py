"""Weight synchronisation with running vLLM instances, without restarting them.

After each training step the trainer writes the new weights as an HF safetensors directory;
every instance loads it in place (seer.fleet.weight_ext via /collective_rpc), drops its
prefix cache (KV computed by the old policy must not be reused), and reports the version.
Where the instances share a filesystem with the trainer that directory is the transfer; where
they do not, the fleet first delivers the files to each node's own directory through Ray
(seer.fleet.ray_hosts, checked by seer.fleet.weight_files) and loads from there (docs/weights.md).
"""

from __future__ import annotations

import asyncio
import json
import re
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
    # A connection of its own: when the RPC raises (a worker refused the weights), vLLM answers
    # 500 and uvicorn then closes the connection, which aiohttp had already pooled again, and the
    # next request on it would fail with "connection reset by peer".
    async with session.post(f"{client.base_url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s),
                            headers={"Connection": "close"}) as r:
        text = await r.text()
        if r.status >= 400:
            raise InstanceError(f"{client.name}: POST {path} failed ({r.status}): {_message(text)[:1500]}")
        return await r.json(content_type=None) if text.strip() else None


def _message(text: str) -> str:
    """vLLM's error message out of its JSON error body (the whole text when it is not one)."""
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text
    worker = re.search(r"Worker failed with error '(.*)', please check the stack trace", message, re.S)
    return f"a worker failed: {worker.group(1)}" if worker else message


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


async def load_into(c: InstanceClient, path: str, version: int, manifest_json: str = "") -> None:
    """Load `path` into one instance (its workers check the files against the manifest first, when
    one is given), check the version it reports, and drop its prefix cache."""
    results = await rpc(c, "seer_load_weights", str(path), str(version), *([manifest_json] if manifest_json else []))
    if {int(v) for v in results} != {version}:
        raise StaleWeightsError(f"{c.name}: loaded version {results}, expected {version}")
    if not await _reset(c, external=False):
        raise InstanceError(f"{c.name}: could not drop the prefix cache after the weight update "
                            f"(still refused after {RESET_RETRY_S:.0f} s)")


async def clear_pool(c: InstanceClient) -> None:
    """Drop the global KV pool's blocks (all computed by older weights), through one instance."""
    if not await _reset(c, external=True):
        raise InstanceError(f"could not clear the KV pool after the weight update (still refused after "
                            f"{RESET_RETRY_S:.0f} s)")


async def push_weights(clients: list[InstanceClient], path: str, version: int, *, kv_pool: bool = False,
                       manifest_json: str = "") -> None:
    """Load `path` into every instance at once, then drop their prefix caches (and the pool's)."""
    await asyncio.gather(*(load_into(c, path, version, manifest_json) for c in clients))
    if kv_pool:
        await clear_pool(clients[0])


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
