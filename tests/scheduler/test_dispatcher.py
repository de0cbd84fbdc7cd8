"""The synchronous core on virtual time, as a discrete-event simulator would drive it."""

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from sched_helpers import prompts, token_at
from seer.types import GenerateResult, SamplingParams
from seer.scheduler.config import SchedulerConfig
from seer.scheduler.decisions import Wait
from seer.scheduler.dispatcher import Dispatcher
from seer.scheduler.placement import free_tokens


def engine(ticket, lengths):
    """Deterministic output for a ticket: tokens up to the request's hidden length."""
    req = ticket.request
    done = len(ticket.generate.prompt_ids) - len(req.prompt_ids)
    n = min(ticket.max_tokens, lengths[(req.group_id, req.sample_index)] - done)
    return GenerateResult(ticket.generate.request_id, [token_at(req.request_id, done + i) for i in range(n)],
                          [0.0] * n, "stop" if done + n >= lengths[(req.group_id, req.sample_index)] else "length",
                          0, len(ticket.generate.prompt_ids), ticket.instance, 0.0, 0.0)


def simulate(disp, lengths, on_start=lambda d: None):
    """Dispatch until Wait, complete the oldest chunk, repeat: FIFO completion order."""
    inflight = deque()
    t = 0.0
    while not disp.done:
        while not isinstance(d := disp.next_decision(), Wait):
            inflight.append(disp.start(d, t))
            on_start(disp)
        assert inflight, "stalled"
        ticket = inflight.popleft()
        t += 1
        disp.complete(ticket, engine(ticket, lengths), t)


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(["divided", "context", "oracle_lfs"]),
    lens=st.lists(st.integers(1, 120), min_size=2, max_size=12),
    capacity=st.integers(40, 600),
    chunk=st.integers(4, 64),
    n_inst=st.integers(1, 3),
)
def test_kv_budget_is_never_exceeded(policy, lens, capacity, chunk, n_inst):
    group_size = 2
    ps = prompts((len(lens) + 1) // 2, prompt_len=6)
    lengths = {(i // group_size, i % group_size): n for i, n in enumerate(lens)}
    lengths.setdefault((len(ps) - 1, 1), 3)
    cfg = SchedulerConfig(policy=policy, chunk_size=chunk, kv_capacity_tokens=capacity, block_size=4,
                          kv_budget_fraction=0.9)
    disp = Dispatcher(ps, group_size, SamplingParams(max_tokens=100), cfg.build_policy(
        lengths if policy == "oracle_lfs" else None), ["a", "b", "c"][:n_inst], kv_capacity_tokens=capacity)

    def check(d):
        for load in d.loads:
            # Within budget, or a lone chunk on an otherwise idle instance.
            assert free_tokens(load, cfg.placement) >= 0 or load.running == 1

    simulate(disp, lengths, check)
    assert len(disp.samples) == len(lengths)
    assert all(load.reserved_tokens == 0 and load.running == 0 for load in disp.loads)
    for s in disp.samples:
        n = min(lengths[(s.group_id, s.sample_index)], 100)
        assert s.response_ids == [token_at(s.request_id, i) for i in range(n)]


def test_next_chunk_prompt_is_prompt_plus_generated_and_seeds_are_per_chunk():
    from seer.scheduler.chunks import chunk_seed

    ps = prompts(1, prompt_len=3)
    lengths = {(0, 0): 25}
    disp = Dispatcher(ps, 1, SamplingParams(max_tokens=100, seed=11),
                      SchedulerConfig(policy="divided", chunk_size=10).build_policy(), ["a", "b"])
    sent = []
    while not disp.done:
        ticket = disp.start(disp.next_decision(), 0.0)
        sent.append(ticket.generate)
        disp.complete(ticket, engine(ticket, lengths), 0.0)
    assert [g.max_tokens for g in sent] == [10, 10, 10]
    assert [g.request_id for g in sent] == ["g0-s0-c0", "g0-s0-c1", "g0-s0-c2"]
    response = disp.samples[0].response_ids
    assert len(response) == 25
    for k, g in enumerate(sent):
        assert g.prompt_ids == [100] * 3 + response[: 10 * k]
        assert g.sampling.seed == chunk_seed(11, "g0-s0", k) and g.sampling.max_tokens == g.max_tokens


def test_telemetry_sets_capacity_and_block_size():
    from seer.types import Telemetry
    from seer.procs.vllm_metrics import telemetry_from_metrics

    text = ('vllm:cache_config_info{block_size="128",num_gpu_blocks="64",kv_cache_size_tokens="None"} 1.0\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.25\n')
    t = telemetry_from_metrics("a", text)
    assert (t.kv_capacity_tokens, t.block_size, t.kv_usage) == (8192, 128, 0.25)
    disp = Dispatcher(prompts(1), 2, SamplingParams(max_tokens=100),
                      SchedulerConfig(policy="divided", chunk_size=10).build_policy(), ["a"])
    disp.observe(t)
    assert disp.load("a").capacity_tokens == 8192 and disp.load("a").block_size == 128
    disp.observe(Telemetry("a", 0.0, 0.5, 8192, 0, 0, 0))  # an older server without the label
    assert disp.load("a").block_size == 128


def test_telemetry_reads_only_its_metrics_and_ignores_histogram_buckets():
    from seer.procs.prometheus import parse_prometheus
    from seer.procs.vllm_metrics import telemetry_from_metrics

    text = "\n".join([
        "# HELP vllm:num_requests_running Number of requests",
        'vllm:num_requests_running{engine="0",model_name="m"} 7.0',
        'vllm:num_requests_running_extra{engine="0"} 100.0',  # same prefix, another metric
        'vllm:num_preemptions_total{engine="0"} 3.0',
        *(f'vllm:request_queue_time_seconds_bucket{{le="{b}"}} 1.0' for b in range(50)),
        'vllm:cache_config_info{block_size="128",num_gpu_blocks="10"} 1.0',
    ])
    t = telemetry_from_metrics("a", text, now=1.0)
    assert (t.num_running, t.preemptions_total, t.kv_capacity_tokens, t.block_size) == (7, 3, 1280, 128)
    assert len(parse_prometheus(text, ("vllm:num_requests_running",))) == 2  # prefix test; names match later
    assert len(parse_prometheus(text)) == 54
