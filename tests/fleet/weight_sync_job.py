"""The scenario of tests/fleet/test_weight_sync.py, as a job that joins the two-node Ray cluster.

A job of its own (like seer-run): the test process may already be connected to another Ray, and a
process joins one Ray only. It launches a fleet of two tiny-model instances, one per node
(STRICT_SPREAD), and pushes weight versions whose files exist only in Ray: a "trainer" actor on
the second node builds each version's checkpoint files in memory (seer.trainer.export
.checkpoint_files) and puts them into its node's object store. It writes a JSON report of what it
saw; the test asserts on it.

    python tests/fleet/weight_sync_job.py --address HOST:PORT --node-ip 127.0.0.3 --model DIR --out REPORT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from pathlib import Path

N_TOKENS = 24
PROMPT = "sum 12 7 30 ="
SCALE = 0.2  # every weight perturbed this much: greedy outputs change


def perturbed(model_dir: str, seed: int) -> dict:
    """The base model's tensors, each plus noise of `seed`: another policy."""
    import torch
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    return {k: v + torch.randn(v.shape, generator=g, dtype=v.dtype) * SCALE
            for k, v in sorted(load_file(str(Path(model_dir) / "model.safetensors")).items())}


class Trainer:
    """Stands in for the trainer's rank 0 on another node: its versions live only in Ray."""

    def export(self, model_dir: str, seed: int):
        import ray
        import torch

        from seer.trainer.export import checkpoint_files
        from seer.types import WeightsRef

        files = checkpoint_files(perturbed(model_dir, seed), model_dir, torch.float32)
        return [ray.put(files)], WeightsRef.manifest_of(files), ray.util.get_node_ip_address()


def hf_greedy(model_dir: str, prompt: list[int], seed: int | None) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if seed is not None:
        missing, unexpected = hf.load_state_dict(perturbed(model_dir, seed), strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=N_TOKENS, do_sample=False)
    return out[0, len(prompt):].tolist()


async def scenario(args) -> dict:
    import ray
    from transformers import AutoTokenizer

    from seer.dgds.server.config import DGDSConfig
    from seer.fleet import Fleet, FleetError, LaunchSettings
    from seer.fleet.config import ClusterConfig, InstancesConfig
    from seer.fleet.weight_files import manifest_json
    from seer.fleet.weights import load_into, weight_version
    from seer.kvpool.config import KVPoolConfig
    from seer.types import GenerateRequest, SamplingParams, WeightsRef

    prompt = AutoTokenizer.from_pretrained(args.model)(PROMPT)["input_ids"]
    notes: list[str] = []
    rep: dict = {"prompt": prompt, "notes": notes}
    cfg = ClusterConfig(address=args.address, node_ip=args.node_ip, placement_strategy="STRICT_SPREAD")
    t0 = time.monotonic()
    fleet = await Fleet.launch(
        InstancesConfig(count=2, kv_cache_bytes=32 * 2**20, max_num_seqs=16), KVPoolConfig(enabled=False),
        DGDSConfig(enabled=False), LaunchSettings(args.model, max_model_len=1024), args.work, notes.append, cfg)
    rep["startup_s"] = time.monotonic() - t0
    async with fleet:
        clients = {c.name: c for c in fleet.backends}
        placed = {s.spec.name: s.node.ip for s in fleet.pool.servers}
        node_id = {s.spec.name: s.node.node_id for s in fleet.pool.servers}
        rep["placed"] = placed
        far = next(n for n, ip in placed.items() if ip != args.node_ip)  # the instance on the other node

        async def greedy(tag: str) -> dict[str, list[int]]:
            out = {}
            for name in fleet.names:
                r = await clients[name].generate(GenerateRequest(f"{tag}-{name}", prompt, N_TOKENS,
                                                                 SamplingParams(temperature=0.0)))
                out[name] = r.token_ids
            return out

        async def state(tag: str) -> dict:
            return {"versions": await fleet.versions(), "greedy": await greedy(tag), "names": fleet.names,
                    "transport": fleet.weights.transport,
                    "dropped": [{"instance": d.instance, "reason": d.reason} for d in fleet.dropped]}

        rep["v0"] = await state("v0")
        trainer = ray.remote(Trainer).options(num_cpus=0, resources={"node1": 0.01}).remote()

        def export(seed: int) -> WeightsRef:
            [obj], manifest, where = ray.get(trainer.export.remote(args.model, seed), timeout=120)
            rep.setdefault("payload_node", where)
            return WeightsRef(seed, f"ray://{obj.hex()}", payload=obj, manifest=manifest)

        # (a) version 1 through Ray to both nodes, each instance from its own node's directory
        ref1 = export(1)
        took = await fleet.weights.push(ref1)
        rep["a"] = {**await state("v1"), "took_s": took,
                    "deliveries": {rec["node"]: rec for held in fleet.weights.deliveries.values() for rec in held.values()}}

        # (b1) version 2 delivered to the far node, a byte of it flipped there, loaded directly
        ref2 = export(2)
        where = Path(await fleet.weights.deliver(node_id[far], ref2, fresh=True))
        weights = where / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
        try:
            await load_into(clients[far], str(where), 2, manifest_json(ref2.manifest))
            rep["b1_error"] = None
        except Exception as e:
            rep["b1_error"] = str(e)
        rep["b1"] = {"version": await weight_version(clients[far]), "greedy": (await greedy("b1"))[far],
                     "instance": far, "dir": str(where)}

        # (b2) the fleet loads version 2: the far node's copy (corrupt) is reused first, refused by
        # the instance, then re-delivered and loaded
        seen = len(notes)
        await fleet.weights.push(ref2)
        rep["b2"] = {**await state("v2"), "notes": notes[seen:]}

        # (b3) the far node's weights folder becomes unwritable (a file in its place): its
        # instance fails twice and is dropped; version 3 is the base model, put into Ray by the fleet
        key_dir = where.parent
        shutil.rmtree(key_dir)
        key_dir.write_text("not a directory\n")
        seen = len(notes)
        await fleet.weights.push(WeightsRef(3, args.model))
        rep["b3"] = {**await state("v3"), "notes": notes[seen:]}

        # (b4) the last instance and a payload that is not its manifest's: refused, still version 3
        ref4 = export(4)
        try:
            await fleet.weights.push(WeightsRef(4, ref4.uri, payload=ref4.payload, manifest=ref2.manifest))
            rep["b4_error"] = None
        except FleetError as e:
            rep["b4_error"] = str(e)
        rep["b4"] = await state("b4")
        key_dir.unlink()
    rep["hf"] = {"v0": hf_greedy(args.model, prompt, None), "v1": hf_greedy(args.model, prompt, 1),
                 "v2": hf_greedy(args.model, prompt, 2)}
    return rep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", required=True)
    p.add_argument("--node-ip", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rep = asyncio.run(scenario(args))
    Path(args.out).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
