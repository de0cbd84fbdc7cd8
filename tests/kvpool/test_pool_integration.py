"""Two real vLLM instances sharing a real Mooncake pool (tests run in file order: the last
one stops the master and starts it again).

Chunk lengths are chosen so that every migrated chunk's context is 128k + 1 tokens: the
connector stores whole 128-token blocks only and vLLM always recomputes the last prompt
token, so then everything but that one token can come from the pool. Before each chunk the
destination's local prefix cache is dropped, so any reused prefix must have come from the pool.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from seer.fleet.measure import MeasuredChunk, generate_measured
from seer.kvpool import BLOCK_TOKENS
from seer.types import GenerateRequest, SamplingParams
from tests.kvpool.serialized import SerializedBackend

pytestmark = pytest.mark.vllm

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
CHUNK = 2 * BLOCK_TOKENS
NUM_CHUNKS = 4


async def reset_until_done(client, timeout_s: float = 60.0) -> bool:
    """vLLM refuses to reset while blocks are still in use (a save to the pool may still be
    running, slowly when the master is gone): retry until it succeeds or the time is up."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await client.reset_prefix_cache():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.5)
    return True


def task_prompts(tiny_model, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from seer.tasks import TaskConfig, encode_prompts, load_task

    tok = AutoTokenizer.from_pretrained(tiny_model)
    task = load_task(TaskConfig(num_prompts=max(n, 8)))
    specs = encode_prompts(task.records, tok, 4096, min_new_tokens=1200)
    return [s.prompt_ids for s in specs[:n]]


def chunk_sizes(prompt_len: int, num_chunks: int) -> list[int]:
    """First chunk brings the context to 128k + 1 tokens; the rest are whole blocks."""
    target = BLOCK_TOKENS + 1
    while target - prompt_len < BLOCK_TOKENS:
        target += BLOCK_TOKENS
    return [target - prompt_len] + [CHUNK] * (num_chunks - 1)


async def uninterrupted(client, prompt, total, rid) -> list[int]:
    r = await client.generate(GenerateRequest(rid, prompt, total, GREEDY))
    assert len(r.token_ids) == total
    return r.token_ids


async def alternating(rig, prompt, sizes, tag, before_chunk=None) -> tuple[list[int], list[MeasuredChunk]]:
    """Chunk i runs on instance i % 2, its prompt = original prompt + everything so far.
    `before_chunk(i)`, when given, runs before chunk i (fault injection)."""
    gen: list[int] = []
    chunks = []
    for i, size in enumerate(sizes):
        client = rig.instances.clients[i % 2]
        assert await reset_until_done(client)  # forget local copies: reuse must come from the pool
        if before_chunk is not None:
            before_chunk(i)
        m = await generate_measured(client, GenerateRequest(f"{tag}-c{i}", prompt + gen, size, GREEDY),
                                    rig.kv_bytes_per_token)
        assert m.result.finish_reason == "length" and len(m.result.token_ids) == size
        gen += m.result.token_ids
        chunks.append(m)
    for c in rig.instances.clients:
        await c.close()
    return gen, chunks


@pytest.fixture(scope="module")
def traces(rig, tiny_model):
    """The reference (one uninterrupted generation) per prompt, shared by the tests below."""
    prompts = task_prompts(tiny_model, 1)

    async def go():
        out = []
        for k, p in enumerate(prompts):
            sizes = chunk_sizes(len(p), NUM_CHUNKS)
            out.append((p, sizes, await uninterrupted(rig.instances.clients[1], p, sum(sizes), f"ref-{k}")))
        for c in rig.instances.clients:
            await c.close()
        return out

    return asyncio.run(go())


def test_alternating_chunks_equal_one_generation_and_load_prefix_from_pool(rig, traces):
    prompt, sizes, ref = traces[0]
    gen, chunks = asyncio.run(alternating(rig, prompt, sizes, "alt"))
    assert gen == ref
    for i, m in enumerate(chunks[1:], start=1):
        u = m.usage
        assert u.prompt_tokens == m.result.prompt_tokens == len(prompt) + sum(sizes[:i])
        assert (m.result.prompt_tokens - 1) % BLOCK_TOKENS == 0
        # vLLM's own counters: the whole prefix but the last token came from the pool
        assert u.tokens_from_pool >= 0.95 * u.prompt_tokens, (i, u)
        assert u.tokens_local_hit == 0
        assert m.result.cached_prefix_tokens == u.tokens_from_pool  # usage agrees with the counters
        # the connector's byte counter equals tokens x per-token KV bytes
        assert not u.bytes_estimated and u.bytes_loaded == u.tokens_from_pool * rig.kv_bytes_per_token
    stats = rig.kv.master_stats()
    assert stats.keys > 0 and 0 < stats.allocated_bytes <= stats.capacity_bytes


def test_driver_chunks_that_migrate_take_their_prefix_from_the_pool(rig, tiny_model):
    from seer.fleet.measure import counters
    from seer.kvpool.accounting import usage_between
    from seer.types import PromptSpec
    from seer.scheduler import RolloutDriver, SchedulerConfig

    # three requests on two instances, one chunk each at a time.
    prompts = [PromptSpec(i, "", p, {}) for i, p in enumerate(task_prompts(tiny_model, 5)[2:5])]
    max_tokens = 3 * CHUNK
    # MoveEveryChunk: every continuation chunk runs on the other instance than its last, so each
    # request's second chunk is a first visit whose generated prefix can only come from the pool;
    # distinct prompts and group_size 1 so that no other request shares a generated prefix.
    cfg = SchedulerConfig(policy="seer.scheduler.policies.moving:MoveEveryChunk", chunk_size=CHUNK, max_running=1)
    a, b = rig.instances.clients
    sampling = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)

    async def go():
        lock = asyncio.Lock()
        driver = RolloutDriver([SerializedBackend(a, lock), SerializedBackend(b, lock)], cfg)
        before = [await counters(c) for c in rig.instances.clients]
        result = await driver.run(prompts, group_size=1, sampling=sampling, request_id_prefix="drv-")
        await asyncio.sleep(0.5)
        after = [await counters(c) for c in rig.instances.clients]
        refs = [await uninterrupted(rig.instances.clients[k % 2], p.prompt_ids, max_tokens, f"drvref-{k}")
                for k, p in enumerate(prompts)]
        for c in rig.instances.clients:
            await c.close()
        return result, [usage_between(b, a) for b, a in zip(before, after)], refs

    result, usage, refs = asyncio.run(go())
    assert [s.response_ids for s in result.samples] == refs  # chunked through the driver = uninterrupted
    visited: dict[str, set[str]] = {}
    first_visits = []
    for ev in sorted(result.chunks, key=lambda e: e.dispatch_time):
        seen = visited.setdefault(ev.request_id, set())
        if ev.migrated and ev.instance not in seen:
            first_visits.append(ev)
        seen.add(ev.instance)
    assert len(first_visits) == len(prompts), first_visits  # each request's second chunk, on the other instance
    assert all(ev.migrated for ev in result.chunks if ev.chunk_index > 0)
    # on a first visit only the prompt can be local; the generated part must come from the pool
    from_pool_lower_bound = sum(ev.cached_prefix_tokens - len(prompts[ev.group_id].prompt_ids) for ev in first_visits)
    assert sum(u.tokens_from_pool for u in usage) >= from_pool_lower_bound > 0
    for ev in first_visits:  # all whole blocks but (at most) one reused; the rest is the tail block
        assert ev.cached_prefix_tokens >= ((ev.prompt_tokens - 1) // BLOCK_TOKENS - 1) * BLOCK_TOKENS, ev
    summary = result.chunk_summary()
    assert summary["chunks_migrated"] >= len(first_visits)


def test_a_full_pool_degrades_to_recompute(rig):
    """Far more distinct prefixes than the pool holds: every request still succeeds, and the
    master evicts (or refuses) instead of the instances failing."""
    import random

    rng = random.Random(0)
    long_prompts = [[rng.randrange(3, 120) for _ in range(2000)] for _ in range(24)]  # 15 blocks each, 360 > 256
    a, b = rig.instances.clients

    async def go():
        first = []
        for k, p in enumerate(long_prompts):
            r = await a.generate(GenerateRequest(f"fill-{k}", p, 4, GREEDY))
            first.append(r.token_ids)
        await asyncio.sleep(1.0)
        # the oldest prompt on the other instance: whatever the pool dropped is recomputed
        assert await b.reset_prefix_cache()
        again = await generate_measured(b, GenerateRequest("fill-again", long_prompts[0], 4, GREEDY),
                                        rig.kv_bytes_per_token)
        for c in rig.instances.clients:
            await c.close()
        return first, again

    first, again = asyncio.run(go())
    assert all(len(t) == 4 for t in first)
    assert again.result.token_ids == first[0]
    stats = rig.kv.master_stats()
    assert stats.allocated_bytes <= stats.capacity_bytes
    assert stats.evicted_keys > 0 or stats.put_start_failures > 0, stats
    assert again.usage.tokens_recomputed > 1, again.usage  # part of the old prefix was evicted


def test_master_down_then_back_on_its_address_chunks_re_prefill_then_load_from_the_pool_again(rig, traces):
    """Master stopped after chunk 0, restarted on the same address after chunk 1, no instance
    restarted. Chunk 1 (migrated while the master is down) recomputes its whole prefix; the new
    master starts empty, so chunk 2 recomputes and stores again, and chunk 3 (migrated) loads
    all its prefix but the last token from the pool. Tokens equal one uninterrupted generation."""
    prompt, sizes, ref = traces[0]
    times: dict[str, float] = {}

    def fault(i: int) -> None:
        if i == 1:
            rig.kv.stop_master()
            assert rig.kv.master_alive() is False
        elif i == 2:
            times["restart_to_usable_s"] = rig.kv.restart_master(timeout_s=30)
            times["restarted_at"] = time.time()  # the clock of GenerateResult.finish_time

    gen, chunks = asyncio.run(alternating(rig, prompt, sizes, "masterbounce", before_chunk=fault))
    assert gen == ref
    down, after_restart, migrated_after = chunks[1], chunks[2], chunks[3]
    assert down.usage.tokens_from_pool == 0 and down.usage.tokens_recomputed == down.result.prompt_tokens
    assert after_restart.usage.tokens_from_pool == 0  # the new master starts empty
    u = migrated_after.usage
    assert u.tokens_from_pool == u.prompt_tokens - 1 and u.tokens_local_hit == 0, u  # the pool is used again
    assert not u.bytes_estimated and u.bytes_loaded == u.tokens_from_pool * rig.kv_bytes_per_token
    assert rig.kv.master_alive() and all(c.alive() for c in rig.instances.servers)
    stats = rig.kv.master_stats()
    assert stats.keys > 0 and stats.capacity_bytes >= rig.kv.config.capacity_bytes  # the store's segment is mounted again
    hit_s = migrated_after.result.finish_time - times["restarted_at"]
    print(f"\nmaster restart: usable (store segment re-mounted) after {times['restart_to_usable_s']:.2f} s; "
          f"first migrated chunk loaded {u.tokens_from_pool}/{u.prompt_tokens} prefix tokens from the pool, "
          f"finished {hit_s:.2f} s after that (2 chunks of {CHUNK} tokens); chunk 1 with the master down took "
          f"{down.wall_s:.2f} s")
