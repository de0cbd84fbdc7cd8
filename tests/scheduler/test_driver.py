"""The async driver's bookkeeping against a deterministic in-process engine (no vLLM).

The faults here run on real vLLM instances too, with the recovery bounds docs/failures.md
quotes: a lost or hung instance and losing every instance in
tests/fleet/test_instance_failure.py, retries exhausted and cancellation in
tests/fleet/test_rollout_faults_real.py."""

import asyncio

import pytest

from sched_helpers import fake_cluster, prompts, token_at
from seer.types import SamplingParams
from seer.scheduler import RolloutDriver, RolloutError, SchedulerConfig, true_lengths_from_samples
from seer.scheduler.chunks import chunk_seed

MAX = 64
CHUNK = 16
LENGTHS = {(g, k): 5 + 9 * g + 13 * k for g in range(3) for k in range(4)}  # 5..71; two exceed MAX


def run(policy, lengths=LENGTHS, n_inst=2, seed=3, true_lengths=None, capacity=400, **kw):
    ps = prompts(3, prompt_len=4)
    fakes = fake_cluster(n_inst, ps, lengths, step_s=0.0002, **kw)
    cfg = SchedulerConfig(policy=policy, chunk_size=CHUNK, kv_capacity_tokens=capacity, block_size=1,
                          telemetry_interval_s=0.01)
    finished, progress = [], []

    async def on_sample(s):  # rewards run asynchronously: the driver must await them
        await asyncio.sleep(0)
        finished.append(s.request_id)

    result = asyncio.run(RolloutDriver(fakes, cfg).run(
        ps, group_size=4, sampling=SamplingParams(max_tokens=MAX, seed=seed), weight_version=7,
        true_lengths=true_lengths, on_sample_finished=on_sample, on_progress=progress.append))
    return result, fakes, finished, progress


@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", ["group_rr", "divided", "context"])
def test_every_request_finishes_with_the_tokens_an_uninterrupted_run_gives(policy):
    result, fakes, finished, progress = run(policy)
    assert [(s.group_id, s.sample_index) for s in result.samples] == sorted(LENGTHS)
    assert sorted(finished) == sorted(s.request_id for s in result.samples)
    assert progress[-1].finished == progress[-1].total == 12 and progress[-1].running_chunks == 0
    for s in result.samples:
        n = min(LENGTHS[(s.group_id, s.sample_index)], MAX)
        assert s.response_ids == [token_at(s.request_id, i) for i in range(n)]  # chunks stitched in order
        assert s.logprobs == [-i / 1000 for i in range(n)]
        assert s.finish_reason == ("length" if LENGTHS[(s.group_id, s.sample_index)] >= MAX else "stop")
        assert s.weight_version == 7 and s.start_time <= s.finish_time
        chunks = 1 if policy == "group_rr" else -(-n // CHUNK)
        assert len(s.instances) == chunks
    assert result.output_tokens == sum(min(n, MAX) for n in LENGTHS.values())
    assert len(result.chunks) == sum(len(s.instances) for s in result.samples)
    assert result.policy == policy and result.wall_s > 0
    assert {t.instance for t in result.telemetry} == {"i0", "i1"}


@pytest.mark.timeout(30)
def test_group_rr_keeps_each_group_on_one_instance():
    result, *_ = run("group_rr")
    by_group = {}
    for s in result.samples:
        by_group.setdefault(s.group_id, set()).update(s.instances)
    assert by_group == {0: {"i0"}, 1: {"i1"}, 2: {"i0"}}


@pytest.mark.timeout(30)
def test_chunk_events_record_prompts_seeds_and_migrations():
    result, fakes, *_ = run("context", capacity=150)  # tight KV: chunks have to spread out
    sent = {g.request_id: g for f in fakes for g in f.requests}
    samples = {s.request_id: s for s in result.samples}
    prev_instance = {}
    for e in sorted(result.chunks, key=lambda e: (e.request_id, e.chunk_index)):
        g = sent[e.chunk_id]
        s = samples[e.request_id]
        assert g.prompt_ids == [100 + e.group_id] * 4 + s.response_ids[: CHUNK * e.chunk_index]
        assert g.sampling.seed == chunk_seed(3, e.request_id, e.chunk_index)
        assert g.max_tokens == min(CHUNK, MAX - CHUNK * e.chunk_index) == e.max_tokens
        assert e.instance == s.instances[e.chunk_index]
        assert e.migrated == (e.request_id in prev_instance and prev_instance[e.request_id] != e.instance)
        if e.chunk_index > 0 and not e.migrated:
            assert e.cached_prefix_tokens == e.prompt_tokens  # stayed with its prefix
        prev_instance[e.request_id] = e.instance
    summary = result.chunk_summary()
    assert summary["chunks_dispatched"] == len(result.chunks)
    assert summary["chunks_migrated"] == sum(e.migrated for e in result.chunks)
    assert summary["probe_phase_s"] is not None


@pytest.mark.timeout(30)
def test_same_seed_same_chunk_seeds_and_tokens():
    a, fa, *_ = run("context")
    b, fb, *_ = run("context")
    seeds = lambda fs: sorted((g.request_id, g.sampling.seed) for f in fs for g in f.requests)
    assert seeds(fa) == seeds(fb)
    assert [s.response_ids for s in a.samples] == [s.response_ids for s in b.samples]


@pytest.mark.timeout(30)
def test_kv_budget_bounds_concurrency_on_real_time():
    # Each chunk reserves at least 4 + 16 - 1 KV slots (the last sampled token has none); a budget
    # of 0.95 * 100 = 95 fits at most 5.
    result, fakes, *_ = run("divided", capacity=100)
    assert max(f.max_running for f in fakes) <= 5
    assert max(f.max_running for f in fakes) >= 2  # and it still runs chunks concurrently


@pytest.mark.timeout(30)
def test_oracle_runs_on_lengths_from_a_previous_run():
    first, *_ = run("context")
    result, *_ = run("oracle_lfs", true_lengths=true_lengths_from_samples(first.samples))
    assert [s.response_ids for s in result.samples] == [s.response_ids for s in first.samples]
    assert result.chunks[0].reason == "oracle"


@pytest.mark.timeout(30)
def test_a_failed_chunk_is_retried_with_a_fresh_id():
    result, fakes, *_ = run("divided", fail_once={"g1-s2-c1"})
    errors = [e for e in result.chunks if e.finish_reason == "error"]
    assert [(e.request_id, e.chunk_index) for e in errors] == [("g1-s2", 1)]
    assert any(g.request_id == "g1-s2-c1-r1" for f in fakes for g in f.requests)
    s = next(s for s in result.samples if s.request_id == "g1-s2")
    assert s.response_ids == [token_at("g1-s2", i) for i in range(min(LENGTHS[(1, 2)], MAX))]
    assert result.chunk_summary()["chunks_failed"] == 1


@pytest.mark.timeout(30)
def test_a_request_that_keeps_failing_fails_the_rollout_and_aborts_the_rest():
    fail = {f"g0-s0-c0{r}" for r in ("", "-r1", "-r2", "-r3")}
    ps = prompts(3, prompt_len=4)
    fakes = fake_cluster(1, ps, LENGTHS, step_s=0.01)
    cfg = SchedulerConfig(policy="divided", chunk_size=CHUNK, max_chunk_retries=3)
    for f in fakes:
        f.fail_once = fail  # shared set: each id fails once, and every retry has a new id
    with pytest.raises(RolloutError, match="g0-s0 failed 4 times"):
        asyncio.run(RolloutDriver(fakes, cfg).run(ps, group_size=4, sampling=SamplingParams(max_tokens=MAX)))
    assert fakes[0].aborted  # chunks still in flight were aborted on their instance


@pytest.mark.timeout(30)
def test_cancelling_a_rollout_aborts_its_chunks_on_the_instances():
    ps = prompts(3, prompt_len=4)
    fakes = fake_cluster(2, ps, LENGTHS, step_s=0.05)

    async def main():
        task = asyncio.create_task(RolloutDriver(fakes, SchedulerConfig(chunk_size=CHUNK)).run(
            ps, group_size=4, sampling=SamplingParams(max_tokens=MAX)))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    aborted = {r for f in fakes for r in f.aborted}
    started = {g.request_id for f in fakes for g in f.requests}
    assert aborted and aborted <= started


def _run_with_fault(policy: str, fault: str, n_inst: int = 3, timeout_s: float = 0.3):
    """Instance i1 dies or hangs after its second chunk; the rollout must finish on the others."""
    ps = prompts(3, prompt_len=4)
    fakes = fake_cluster(n_inst, ps, LENGTHS, step_s=0.0005)
    fakes[1].fault, fakes[1].fault_after = fault, 2
    cfg = SchedulerConfig(policy=policy, chunk_size=CHUNK, kv_capacity_tokens=400, block_size=1,
                          telemetry_interval_s=0.01, instance_timeout_s=timeout_s, max_chunk_retries=0)
    driver = RolloutDriver(fakes, cfg, telemetry_timeout_s=0.05)
    result = asyncio.run(driver.run(ps, group_size=4, sampling=SamplingParams(max_tokens=MAX)))
    return result, fakes


@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", ["group_rr", "divided", "context"])
@pytest.mark.parametrize("fault", ["dead", "hung"])
def test_a_lost_instance_is_dropped_and_its_requests_finish_elsewhere(policy, fault):
    result, fakes = _run_with_fault(policy, fault)
    # complete and identical to an uninterrupted run: chunks resume from the tokens received
    assert [(s.group_id, s.sample_index) for s in result.samples] == sorted(LENGTHS)
    for s in result.samples:
        n = min(LENGTHS[(s.group_id, s.sample_index)], MAX)
        assert s.response_ids == [token_at(s.request_id, i) for i in range(n)]
        assert len(s.logprobs) == n
    assert [(name, why.split(":")[0]) for name, why, _ in result.dropped] == [("i1", fault)]
    dropped_at = result.dropped[0][2]
    late = [c for c in result.chunks if c.dispatch_time > dropped_at]
    assert late and all(c.instance != "i1" for c in late)
    lost = [c for c in result.chunks if c.finish_reason == "error"]
    assert lost and all(c.instance == "i1" for c in lost)  # max_chunk_retries=0: the loss was not counted


@pytest.mark.timeout(30)
def test_losing_every_instance_fails_the_rollout_naming_them():
    ps = prompts(3, prompt_len=4)
    fakes = fake_cluster(2, ps, LENGTHS, step_s=0.0005)
    for f in fakes:
        f.fault, f.fault_after = "dead", 1
    cfg = SchedulerConfig(policy="divided", chunk_size=CHUNK, kv_capacity_tokens=400, telemetry_interval_s=0.01)
    with pytest.raises(RolloutError, match="every instance is down: i0: dead.*i1: dead"):
        asyncio.run(RolloutDriver(fakes, cfg, telemetry_timeout_s=0.05).run(
            ps, group_size=4, sampling=SamplingParams(max_tokens=MAX)))


@pytest.mark.timeout(30)
def test_a_partial_rollout_stops_once_asked_and_returns_what_the_others_had():
    ps = prompts(3, prompt_len=4)
    fakes = fake_cluster(2, ps, LENGTHS, step_s=0.0002)
    cfg = SchedulerConfig(policy="divided", chunk_size=CHUNK, kv_capacity_tokens=400, block_size=1,
                          telemetry_interval_s=0.01)
    calls = []

    def stop_when(samples):
        calls.append(len(samples))
        return len(samples) >= 3

    result = asyncio.run(RolloutDriver(fakes, cfg).run(ps, group_size=4, sampling=SamplingParams(max_tokens=MAX, seed=3),
                                                       stop_when=stop_when))
    # asked after each sample and after each wake-up (rewards land between samples); it stops at the third
    assert sorted(set(calls)) == [1, 2, 3] and calls[-1] == 3 and len(result.samples) == 3
    assert len(result.unfinished) == 12 - 3
    assert {(u.group_id, u.sample_index) for u in result.unfinished} | {
        (s.group_id, s.sample_index) for s in result.samples} == set(LENGTHS)
    for u in result.unfinished:  # the tokens of its completed chunks, in order; an aborted one adds none
        assert list(u.response_ids) == [token_at(u.request_id, i) for i in range(len(u.response_ids))]
        assert len(u.instances) == len(u.response_ids) // CHUNK + (len(u.response_ids) % CHUNK > 0)
        assert u.loss_mask is None and u.turns == 0 and not u.waiting_env
