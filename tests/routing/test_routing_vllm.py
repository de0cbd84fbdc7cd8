"""Routing replay on real vLLM: two instances of a tiny random Qwen3-MoE sharing a real Mooncake pool,
their capture on (seer.fleet.routing_ext), the driver joining each chunk's routing.

One module fixture runs everything once (the suite's budget): a reference rollout whose requests
never move (one whole-request chunk each, on one instance), and the same greedy requests cut into
chunks that move between the instances at every chunk (their prefixes come from the pool), in
groups of two that share their prompt through the prefix cache. The tests compare the two, and
the capture with transformers' own router on the same weights and tokens.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import numpy as np
import pytest

from seer.kvpool import BLOCK_TOKENS, KVPool, KVPoolConfig
from seer.types import PromptSpec, SamplingParams
from tests.kvpool.serialized import SerializedBackend

pytestmark = pytest.mark.vllm

CHUNK = BLOCK_TOKENS
MAX_TOKENS = 3 * CHUNK  # three chunks, each on the other instance than the last
GROUP = 2


@dataclass
class Runs:
    model: str
    reference: object  # RolloutResult: whole requests, never moved
    moved: object  # RolloutResult: chunks moving through the pool, groups sharing their prompt
    header: dict


def _prompts(n: int) -> list[PromptSpec]:
    rng = np.random.default_rng(7)
    # 1.5 blocks: the first whole block of a prompt is what a group-mate can find cached
    return [PromptSpec(i, "", [int(t) for t in rng.integers(4, 260, BLOCK_TOKENS + 40 + i)], {}) for i in range(n)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from seer.fleet.instance import InstanceSpec
    from seer.fleet.pool import InstancePool
    from seer.procs import cpu_sets, free_port
    from seer.scheduler import RolloutDriver, SchedulerConfig

    from tests.routing.checkpoint import build_tiny_moe

    work = tmp_path_factory.mktemp("routing")
    model = build_tiny_moe(work / "moe")
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    cfg = KVPoolConfig(capacity_bytes=16 * 2**20, local_buffer_bytes=16 * 2**20, kv_lease_ttl_ms=1000)
    prompts = _prompts(2)
    greedy = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=MAX_TOKENS)
    with KVPool.start(cfg, work) as kv:
        specs = [kv.configure(InstanceSpec(name=f"moe{i}", model=str(model), port=free_port(), cpus=c,
                                           max_model_len=2048, kv_cache_bytes=32 * 2**20, max_num_seqs=16,
                                           extra_args=("--enforce-eager",)))
                 for i, c in enumerate(sets)]
        with InstancePool.launch(specs, work, ready_timeout_s=600) as pool:
            async def go():
                a, b = pool.clients
                headers = [await c.enable_routing() for c in (a, b)]
                # reference: one request per group, whole, on one instance (nothing loaded but its own)
                ref = await RolloutDriver([a], SchedulerConfig(policy="group_rr")).run(
                    prompts, group_size=1, sampling=greedy, request_id_prefix="ref-")
                for c in (a, b):  # forget the reference's KV: the moved run computes its own
                    assert await c.reset_prefix_cache(external=True)
                lock = asyncio.Lock()
                moved = await RolloutDriver(
                    [SerializedBackend(a, lock), SerializedBackend(b, lock)],
                    SchedulerConfig(policy="seer.scheduler.policies.moving:MoveEveryChunk", chunk_size=CHUNK,
                                    max_running=1),
                ).run(prompts, group_size=GROUP, sampling=greedy, request_id_prefix="mv-")
                for c in (a, b):
                    await c.close()
                return ref, moved, headers[0]

            ref, moved, header = asyncio.run(go())
    return Runs(str(model), ref, moved, header)


def _rows(sample, header) -> np.ndarray:
    n = len(sample.prompt.prompt_ids) + len(sample.response_ids)
    return np.frombuffer(sample.routing.data, np.uint8).reshape(n, header["layers"], header["top_k"])


def test_every_sample_has_one_routing_row_per_prompt_and_response_token(runs):
    assert runs.header == {"layers": 2, "top_k": 2, "dtype": "uint8", "num_experts": 8}
    for result in (runs.reference, runs.moved):
        assert result.samples and result.routing["rows_recorded"] > 0
        for s in result.samples:
            assert s.routing is not None and s.routing.num_tokens == len(s.prompt.prompt_ids) + len(s.response_ids)
            assert (s.routing.layers, s.routing.top_k, s.routing.dtype) == (2, 2, "uint8")
            assert len(s.response_ids) == MAX_TOKENS
        assert result.routing.get("recompute_requests", 0) == 0  # nothing was lost: no recompute


def test_moved_chunks_and_cached_prompts_carry_the_routing_their_computing_chunk_recorded(runs):
    moved, ref = runs.moved, runs.reference
    migrated = [c for c in moved.chunks if c.migrated]
    assert migrated and all(c.cached_prefix_tokens > 0 for c in migrated)  # prefixes came from the pool
    # the second sample of each group found its prompt's first block already computed
    assert any(c.chunk_index == 0 and c.sample_index > 0 and c.cached_prefix_tokens >= BLOCK_TOKENS
               for c in moved.chunks)
    assert moved.routing["prefix_rows_loaded"] >= len(migrated) * CHUNK
    ref_of = {s.group_id: s for s in ref.samples}
    for s in moved.samples:
        r = ref_of[s.group_id]
        assert s.response_ids == r.response_ids  # greedy: moving changes no token
        got, want = _rows(s, runs.header), _rows(r, runs.header)
        # as sets of experts per layer (vLLM's top-k is unsorted); the last token is the filler
        same = np.sort(got[:-1], axis=-1) == np.sort(want[:-1], axis=-1)
        assert same.all(), f"{s.request_id}: {int((~same.all(axis=(1, 2))).sum())} tokens routed differently"


def test_captured_routing_agrees_with_transformers_router_on_the_same_weights(runs):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(runs.model, dtype=torch.float32).eval()
    differ, total = 0, 0
    for s in runs.moved.samples[::GROUP]:
        tokens = [*s.prompt.prompt_ids, *s.response_ids]
        with torch.no_grad():
            out = model(torch.tensor([tokens]), output_router_logits=True)
        hf = np.stack([lg.topk(2, dim=-1).indices.numpy() for lg in out.router_logits], axis=1)  # [T, L, k]
        got = _rows(s, runs.header)[:-1]
        same = np.sort(got, axis=-1) == np.sort(hf[:-1], axis=-1)
        differ += int((~same.all(axis=-1)).sum())  # router decisions (token x layer) that differ
        total += same.shape[0] * same.shape[1]
    rate = differ / total
    print(f"router decisions differing between vLLM's capture and transformers: {differ}/{total} = {rate:.4%}")
    assert rate < 0.02
