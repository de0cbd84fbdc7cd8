"""The driver's two non-instance faults on real vLLM instances (the session's two-instance pool):
a request whose chunk keeps failing fails the rollout, and a cancelled rollout stops; in both
cases the chunks still running are aborted on the instances, which go idle within the bound
(tests/failure_record.py's RECORDS) and generate far less than the chunks asked for.
tests/scheduler/test_driver.py checks the same bookkeeping on the in-process fake; docs/failures.md
cites both.

The chunks are long (LONG tokens, EOS ignored), so an instance that was not told to stop would
keep generating for many seconds: its generation-token counter shows whether the abort reached it.
With SEER_RECORD=1 the measured times go to bench/results/failures/ (tests/failure_record.py).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from failure_record import Bound, bound, record
from seer.procs.prometheus import parse_prometheus
from seer.scheduler import RolloutDriver, RolloutError, SchedulerConfig
from seer.tasks import TaskConfig, encode_prompts, load_task
from seer.types import PromptSpec, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

LONG = 1536
GROUPS, GROUP_SIZE = 3, 2
IDLE_AFTER_ERROR = bound("retries_exhausted", "instances_idle_after_error")
IDLE_AFTER_CANCEL = bound("rollout_cancelled", "instances_idle_after_cancel")


def _prompts(tiny_model) -> list[PromptSpec]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    return encode_prompts(load_task(TaskConfig(num_prompts=GROUPS, seed=5)).records, tok, 1024)


def _sampling() -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=LONG, ignore_eos=True, seed=1)


def _config(**kw) -> SchedulerConfig:
    return SchedulerConfig(policy="divided", chunk_size=LONG, telemetry_interval_s=0.2, **kw)


async def _counters(clients) -> tuple[int, int]:
    """(requests running or waiting, generation tokens so far) over the instances."""
    busy = tokens = 0
    for c in clients:
        for name, _, value in parse_prometheus(await c.metrics_text()):
            if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                busy += int(value)
            elif name == "vllm:generation_tokens_total":
                tokens += int(value)
    return busy, tokens


async def _idle_after(clients, t0: float, within: Bound) -> float:
    """Seconds from `t0` until no instance runs or queues a request (fails past `within`)."""
    while True:
        busy, _ = await _counters(clients)
        took = time.monotonic() - t0
        within.check(took, what=f"after the stop: {busy} requests on the instances")
        if busy == 0:
            return took
        await asyncio.sleep(0.05)


def test_a_chunk_that_keeps_failing_fails_the_rollout_and_aborts_the_rest(vllm_pool, tiny_model):
    """A prompt longer than the instances' max_model_len (4096): vLLM rejects its chunk (400)
    every time, the instance stays up, so each rejection counts; after max_chunk_retries the
    rollout fails naming the request, and the other groups' long chunks are aborted."""
    bad = PromptSpec(GROUPS, "too long", [7] * 5000, {})
    prompts = _prompts(tiny_model) + [bad]
    clients = vllm_pool.clients

    async def go():
        _, before = await _counters(clients)
        try:
            await RolloutDriver(clients, _config(max_chunk_retries=2)).run(
                prompts, group_size=GROUP_SIZE, sampling=_sampling(), request_id_prefix="retry-")
        except RolloutError as e:
            failed_at = time.monotonic()
            idle = await _idle_after(clients, failed_at, IDLE_AFTER_ERROR)
            _, after = await _counters(clients)
            return e, idle, after - before
        finally:
            for c in clients:
                await c.close()
        raise AssertionError("the rollout finished although one request could never run")

    error, idle, generated = asyncio.run(go())
    assert f"retry-g{GROUPS}-s" in str(error) and "failed 3 times" in str(error), error
    assert "rejected (400)" in str(error), error
    full = GROUPS * GROUP_SIZE * LONG
    assert generated < full / 2, f"{generated} of {full} tokens generated: the other chunks were not aborted"
    record("retries_exhausted",
           {"instances_idle_after_error_s": round(idle, 2), "tokens_generated": generated, "tokens_asked": full,
            "error": str(error)[:300]},
           "2 instances; a 5000-token prompt (max_model_len 4096) rejected 3 times (max_chunk_retries=2) next to "
           f"{GROUPS}x{GROUP_SIZE} requests of {LONG} tokens (EOS ignored)")


def test_cancelling_a_rollout_aborts_its_chunks_on_the_instances(vllm_pool, tiny_model):
    prompts = _prompts(tiny_model)
    clients = vllm_pool.clients

    async def go():
        _, before = await _counters(clients)
        task = asyncio.create_task(RolloutDriver(clients, _config()).run(
            prompts, group_size=GROUP_SIZE, sampling=_sampling(), request_id_prefix="cancel-"))
        deadline = time.monotonic() + 120
        while (await _counters(clients))[1] - before < 20:  # generating on the instances
            assert not task.done(), task
            assert time.monotonic() < deadline, "the rollout never started generating"
            await asyncio.sleep(0.05)
        cancelled_at = time.monotonic()
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
            idle = await _idle_after(clients, cancelled_at, IDLE_AFTER_CANCEL)
            _, after = await _counters(clients)
        finally:
            for c in clients:
                await c.close()
        return idle, after - before

    idle, generated = asyncio.run(go())
    full = GROUPS * GROUP_SIZE * LONG
    assert generated < full / 2, f"{generated} of {full} tokens generated: the chunks were not aborted"
    record("rollout_cancelled",
           {"instances_idle_after_cancel_s": round(idle, 2), "tokens_generated": generated, "tokens_asked": full},
           f"2 instances; {GROUPS}x{GROUP_SIZE} requests of {LONG} tokens (EOS ignored), the driver's task "
           "cancelled once 20 tokens were out")
