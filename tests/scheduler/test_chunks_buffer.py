import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sched_helpers import prompts
from seer.scheduler.buffer import Request, RequestBuffer, RequestStatus
from seer.request_ids import chunk_id
from seer.scheduler.chunks import chunk_max_tokens, chunk_seed


@given(st.integers(1, 10_000), st.integers(1, 100_000), st.data())
def test_chunk_max_tokens_is_min_of_chunk_and_remaining(chunk, max_tokens, data):
    generated = data.draw(st.integers(0, max_tokens - 1))
    n = chunk_max_tokens(chunk, max_tokens, generated)
    assert n == min(chunk, max_tokens - generated)
    assert 1 <= n <= chunk


def test_chunk_max_tokens_edges():
    assert chunk_max_tokens(None, 100, 30) == 70  # unchunked: the whole remainder
    assert chunk_max_tokens(8192, 65536, 65000) == 536
    with pytest.raises(ValueError):
        chunk_max_tokens(8192, 100, 100)
    with pytest.raises(ValueError):
        chunk_max_tokens(0, 100, 0)


@given(st.sampled_from([16, 128]), st.integers(1, 8), st.integers(1, 4000), st.data())
def test_block_aligned_chunks_end_where_their_kv_fills_a_block(block, blocks_per_chunk, context, data):
    chunk = block * blocks_per_chunk
    max_tokens = data.draw(st.integers(1, 8192))
    generated = data.draw(st.integers(0, max_tokens - 1))
    n = chunk_max_tokens(chunk, max_tokens, generated, context_len=context, block_size=block)
    assert 1 <= n <= min(chunk, max_tokens - generated)
    if n < max_tokens - generated:  # not the request's last chunk: KV for context + n - 1 tokens
        assert (context + n - 1) % block == 0 and n > chunk - block


def test_block_aligned_chunk_examples():
    # the default task's ~60-token prompt, vLLM CPU's 128-token blocks, 256-token chunks
    assert chunk_max_tokens(256, 2048, 0, context_len=60, block_size=128) == 197  # KV 256 = 2 blocks
    assert chunk_max_tokens(256, 2048, 197, context_len=257, block_size=128) == 256  # then whole chunks
    assert chunk_max_tokens(256, 2048, 2000, context_len=2060, block_size=128) == 48  # the remainder
    assert chunk_max_tokens(8, 100, 0, context_len=5, block_size=16) == 8  # smaller than a block: as is


def test_chunk_seed_depends_only_on_base_request_and_chunk():
    assert chunk_seed(None, "g0-s0", 0) is None
    s = chunk_seed(7, "g0-s0", 0)
    assert s == chunk_seed(7, "g0-s0", 0)
    assert 0 <= s < 2**31
    others = {chunk_seed(8, "g0-s0", 0), chunk_seed(7, "g0-s1", 0), chunk_seed(7, "g0-s0", 1)}
    assert s not in others and len(others) == 3
    assert chunk_id("g3-s1", 2) == "g3-s1-c2"


def test_buffer_builds_groups_of_requests():
    buf = RequestBuffer(prompts(3, prompt_len=5), group_size=4, max_tokens=50, request_id_prefix="it1-")
    assert len(buf) == 12 and len(buf.groups) == 3
    r = buf.requests["it1-g2-s3"]
    assert (r.group_id, r.sample_index, r.max_tokens, r.prompt_ids) == (2, 3, 50, [102] * 5)
    assert [q.seq for q in buf.ready()] == list(range(12))


def test_non_final_chunk_puts_request_back_with_prompt_plus_generated():
    buf = RequestBuffer(prompts(1, prompt_len=3), group_size=1, max_tokens=100)
    req = buf.requests["g0-s0"]
    assert buf.begin_chunk(req, "i0", now=1.0) == 0
    assert req.status is RequestStatus.RUNNING and buf.num_running == 1
    assert not buf.end_chunk(req, [5, 6], [-0.5, -0.6], "length", now=2.0)
    assert req.status is RequestStatus.READY and buf.num_running == 0
    assert req.next_prompt() == [100, 100, 100, 5, 6]
    assert req.prompt_ids == [100, 100, 100]  # the original prompt is untouched
    assert buf.begin_chunk(req, "i1", now=3.0) == 1
    assert buf.end_chunk(req, [9], [-0.9], "stop", now=4.0)
    assert req.status is RequestStatus.FINISHED and buf.done
    assert req.generated_ids == [5, 6, 9] and req.logprobs == [-0.5, -0.6, -0.9]
    assert req.instances == ["i0", "i1"] and (req.first_start, req.last_finish) == (1.0, 4.0)


def test_request_finishes_at_its_length_limit_not_at_a_chunk_limit():
    buf = RequestBuffer(prompts(1), group_size=1, max_tokens=4)
    req = buf.requests["g0-s0"]
    buf.begin_chunk(req, "i0", 0.0)
    assert not buf.end_chunk(req, [1, 2], [], "length", 0.0)
    assert all(math.isnan(x) for x in req.logprobs) and len(req.logprobs) == 2  # kept aligned
    buf.begin_chunk(req, "i0", 0.0)
    assert buf.end_chunk(req, [3, 4], [0.0, 0.0], "length", 0.0)
    assert req.finish_reason == "length" and req.generated == 4


def test_requeue_returns_request_unchanged_and_counts_failure():
    buf = RequestBuffer(prompts(1), group_size=1, max_tokens=10)
    req = buf.requests["g0-s0"]
    buf.begin_chunk(req, "i0", 0.0)
    buf.requeue(req, 1.0)
    assert req.status is RequestStatus.READY and req.instances == [] and req.failures == 1
    with pytest.raises(ValueError):
        buf.end_chunk(req, [1], [0.0], "stop", 0.0)  # not running


def test_request_carries_no_length_it_could_not_know():
    """Guard for the oracle rule: nothing in a Request may reveal how long it will be."""
    fields = set(Request.__dataclass_fields__)
    assert fields == {
        "request_id", "group_id", "sample_index", "prompt_ids", "max_tokens", "seq", "status",
        "generated_ids", "logprobs", "instances", "finish_reason", "first_start", "last_finish", "failures",
        "turns",  # turns ended so far: known, like generated_ids
    }
