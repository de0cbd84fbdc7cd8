"""Fault injection on real vLLM instances: one is killed (SIGKILL) and one hangs (SIGSTOP) in the
middle of a rollout. Every sample must still come back, shaped as in a fault-free run, with the
lost instances named and dropped from the pool.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from seer.procs.process import _children
from seer.types import SamplingParams
from seer.scheduler import RolloutDriver, SchedulerConfig
from seer.tasks import TaskConfig, encode_prompts, load_task

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

GROUP_SIZE = 4
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def three_instances(tiny_model, tmp_path_factory):
    """Its own instances: this test kills two of them, so it cannot share the session pool."""
    from seer.fleet.instance import InstanceSpec
    from seer.procs import free_port
    from seer.fleet.pool import InstancePool

    cores = sorted(os.sched_getaffinity(0))
    specs = [
        InstanceSpec(name=f"f{i}", model=str(tiny_model), port=free_port(), cpus=str(cores[i % len(cores)]),
                     max_model_len=1024, kv_cache_bytes=48 * 2**20, max_num_seqs=64)
        for i in range(3)
    ]
    pool = InstancePool.launch(specs, tmp_path_factory.mktemp("fault-logs"), ready_timeout_s=600)
    yield pool
    for srv in pool.servers:  # a stopped group must be resumed to die on SIGTERM
        for pid in _children(srv.proc.pid):
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    pool.close()


def _prompts(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return encode_prompts(load_task(TaskConfig(num_prompts=6, seed=11)).records, tok, 1024)


async def _rollout(clients, prompts, on_progress=None):
    cfg = SchedulerConfig(policy="divided", chunk_size=16, telemetry_interval_s=0.2, instance_timeout_s=5.0,
                          max_chunk_retries=1)
    try:
        return await RolloutDriver(clients, cfg, telemetry_timeout_s=2.0).run(
            prompts, group_size=GROUP_SIZE, sampling=SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS),
            on_progress=on_progress,
        )
    finally:
        for c in clients:
            await c.close()


def _shape(samples):
    return [(s.group_id, s.sample_index) for s in samples]


def test_killed_and_hung_instances_lose_no_sample(three_instances, tiny_model):
    pool = three_instances
    prompts = _prompts(tiny_model)
    reference = asyncio.run(_rollout(pool.clients, prompts))
    assert not reference.dropped

    hung, dead = pool.server("f1"), pool.server("f2")

    async def faulty():
        state = {"done": False}

        def on_progress(p):  # inject once output is flowing, so chunks are in flight on both victims
            if not state["done"] and p.output_tokens >= 200:
                state["done"] = True
                state["at"] = time.monotonic()  # the driver's clock: RolloutResult.dropped times
                for pid in _children(hung.proc.pid):
                    os.killpg(pid, signal.SIGSTOP)
                dead.kill()

        t0 = time.monotonic()
        result = await _rollout(pool.clients, prompts, on_progress)
        return result, state, time.monotonic() - t0

    result, state, wall = asyncio.run(faulty())
    injected = state["done"]
    assert injected, "the rollout finished before the faults were injected"

    assert _shape(result.samples) == _shape(reference.samples)  # nothing lost, nothing extra
    for s in result.samples:
        assert 0 < len(s.response_ids) <= MAX_TOKENS and len(s.logprobs) == len(s.response_ids)
        assert s.finish_reason in ("stop", "length")
    why = {name: reason for name, reason, _ in result.dropped}
    assert set(why) == {"f1", "f2"}, result.dropped
    assert why["f1"].startswith("hung") and why["f2"].startswith("dead")
    last_drop = max(t for *_, t in result.dropped)
    assert all(c.instance == "f0" for c in result.chunks if c.dispatch_time > last_drop)
    moved = [c for c in result.chunks if c.finish_reason == "error"]
    assert moved, "no chunk was in flight on a lost instance"

    for name in why:
        pool.drop(name)
    assert pool.names == ["f0"] and not dead.alive() and not hung.alive()
    when = {name: t - state["at"] for name, _, t in result.dropped}
    print(f"\nkill + hang: rollout {wall:.1f} s (fault-free {reference.wall_s:.1f} s, hang timeout 5 s); "
          f"{len(moved)} chunks re-run elsewhere; killed instance dropped {when['f2']:.2f} s after the kill, "
          f"hung one {when['f1']:.2f} s after the stop")
