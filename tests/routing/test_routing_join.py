"""The driver joins each chunk's routing into its sample's (seer.scheduler.routing), on an in-process
engine with a prefix cache and a shared KV pool: rows exist only for tokens a chunk computed, and a
token's routing is a function of its prefix, as in a real model. Every case of docs/models.md's
"Routing replay (R3)": chunks on different instances, prefixes loaded from the pool, a group's
prompt shared through the cache, an instance dying mid-request, multi-turn observations."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest

from seer.scheduler import RolloutDriver, SchedulerConfig
from seer.scheduler.routing import RoutingIncomplete, RoutingLedger
from seer.scheduler.turns import TurnCut, TurnReply
from seer.types import GenerateResult, PromptSpec, Routing, SamplingParams, Telemetry

BLOCK, LAYERS, TOP_K = 4, 3, 2


def row(prefix: tuple[int, ...]) -> np.ndarray:
    """The experts of the last token of `prefix`: a function of the whole prefix (its context)."""
    h = hashlib.blake2b(repr(prefix).encode(), digest_size=LAYERS * TOP_K).digest()
    return (np.frombuffer(h, np.uint8) % 64).reshape(LAYERS, TOP_K)


def expected(tokens: list[int]) -> np.ndarray:
    return np.stack([row(tuple(tokens[: p + 1])) for p in range(len(tokens))])


class PrefixEngine:
    """Tokens from (sample, position); KV in blocks of BLOCK tokens, in a local cache and a pool
    shared by every engine; routing rows for the tokens computed here only. `die_after`: the
    engine computes that many chunks, then dies with every later one (KV already in the pool)."""

    def __init__(self, name: str, pool: set, die_after: int | None = None) -> None:
        self.name, self.pool, self.local, self.die_after = name, pool, set(), die_after
        self.routing = {"layers": LAYERS, "top_k": TOP_K, "dtype": "uint8", "num_experts": 64}
        self.chunks = 0
        self.computed_from: list[int] = []

    def _cached(self, prompt: list[int], salted: bool) -> int:
        if salted:
            return 0
        n = 0
        while n + BLOCK <= len(prompt) - 1 and tuple(prompt[: n + BLOCK]) in (self.pool | self.local):
            n += BLOCK
        return n

    async def generate(self, req):
        await asyncio.sleep(0)
        prompt = list(req.prompt_ids)
        sample = req.request_id.split("-c")[0]
        out = []
        for k in range(req.max_tokens):
            pos = len(prompt) + k
            tok = 10 + int(hashlib.md5(f"{sample}/{pos}".encode()).digest()[0]) % 50
            out.append(tok)
            if tok == 11:  # EOS
                break
        start = self._cached(prompt, bool(req.cache_salt))
        seq = prompt + out
        end = len(seq) - 1  # the last sampled token is never fed back
        for b in range(BLOCK, end + 1, BLOCK):  # saved blocks (whole ones only)
            (self.pool if not req.cache_salt else set()).add(tuple(seq[:b]))
            self.local.add(tuple(seq[:b]))
        self.chunks += 1
        self.computed_from.append(start)
        if self.die_after is not None and self.chunks > self.die_after:
            raise ConnectionError(f"{self.name} died")
        rows = np.stack([row(tuple(seq[: p + 1])) for p in range(start, end)]) if end > start else np.zeros((0, LAYERS, TOP_K), np.uint8)
        finish = "stop" if out and out[-1] == 11 else "length"
        return GenerateResult(req.request_id, out, [-0.5] * len(out), finish, start, len(prompt), self.name,
                              0.0, 0.0, Routing(LAYERS, TOP_K, "uint8", rows.astype(np.uint8).tobytes()), start)

    async def abort(self, request_id):
        pass

    async def telemetry(self):
        if self.die_after is not None and self.chunks > self.die_after:
            raise ConnectionError(f"{self.name} died")
        return Telemetry(self.name, 0.0, 0.0, 100_000, 0, 0, 0, block_size=BLOCK)


def prompts(n: int) -> list[PromptSpec]:
    # a shared 8-token template prefix across groups, then each prompt's own tokens
    return [PromptSpec(i, "", [3, 4, 5, 6, 7, 8, 9, 2] + [20 + i] * (5 + i), {}) for i in range(n)]


def check_complete(samples) -> None:
    for s in samples:
        tokens = [*s.prompt.prompt_ids, *s.response_ids]
        r = s.routing
        assert r is not None and r.num_tokens == len(tokens)
        got = np.frombuffer(r.data, np.uint8).reshape(len(tokens), LAYERS, TOP_K)
        np.testing.assert_array_equal(got[:-1], expected(tokens)[:-1])  # the last: a filler, see routing.py


def run(engines, cfg, **kw):
    return asyncio.run(RolloutDriver(engines, cfg).run(prompts(3), group_size=4,
                                                       sampling=SamplingParams(max_tokens=24), **kw))


def test_chunks_moving_through_the_pool_and_a_shared_group_prompt_join_into_complete_routing():
    pool: set = set()
    engines = [PrefixEngine(f"e{i}", pool) for i in range(3)]
    cfg = SchedulerConfig(policy="seer.scheduler.policies.moving:MoveEveryChunk", chunk_size=5)
    result = run(engines, cfg)
    check_complete(result.samples)
    assert any(s.instances and len(set(s.instances)) > 1 for s in result.samples)  # chunks did move
    assert any(start > 0 for e in engines for start in e.computed_from)  # prefixes loaded, not computed
    assert result.routing.get("recompute_requests", 0) == 0  # every loaded token's row came from a chunk
    assert result.routing["last_token_filler"] == len(result.samples)
    assert result.routing.get("shared_rows_differing", 0) == 0


def test_an_instance_dying_after_prefilling_a_group_prompt_has_that_routing_recomputed():
    pool: set = set()
    # e0 computes one chunk (its KV reaches the pool), then dies before returning anything
    engines = [PrefixEngine("e0", pool, die_after=0), PrefixEngine("e1", pool), PrefixEngine("e2", pool)]
    cfg = SchedulerConfig(chunk_size=6, instance_timeout_s=30)
    result = run(engines, cfg)
    assert result.dropped and result.dropped[0][0] == "e0"
    check_complete(result.samples)
    assert result.routing["recompute_requests"] >= 1 and result.routing["recomputed_tokens"] > 0


class EveryFourTokens:
    """A turn ends after 4 model tokens (a stand-in for a stop string)."""

    stop: tuple[str, ...] = ()
    max_turn_tokens = None

    def stop_for(self, request_id):
        return self.stop

    def turn_limit(self, request_id):
        return self.max_turn_tokens

    def cut(self, turn_ids, new_ids, finish_reason, request_id=None):
        if len(turn_ids) + len(new_ids) >= 4:
            return TurnCut(4 - len(turn_ids), "stop_sequence")
        return None


def test_multi_turn_observation_tokens_get_the_routing_of_the_next_turns_prefill():
    pool: set = set()
    engines = [PrefixEngine(f"e{i}", pool) for i in range(2)]

    async def on_turn_end(end):
        if end.turn >= 3:
            return TurnReply(done=True)
        return TurnReply(observation_ids=(40 + end.turn, 41, 42))

    cfg = SchedulerConfig(chunk_size=3)
    result = asyncio.run(RolloutDriver(engines, cfg).run(
        prompts(2), group_size=2, sampling=SamplingParams(max_tokens=40), turns=EveryFourTokens(),
        on_turn_end=on_turn_end))
    assert all(s.turns >= 2 and 0 in s.loss_mask for s in result.samples)
    check_complete(result.samples)


def test_a_chunk_without_routing_is_recomputed_and_a_failed_recompute_fails_loudly():
    ledger = RoutingLedger()
    tokens = list(range(1, 11))
    rows = expected(tokens)
    good = GenerateResult("r-c0", tokens[6:], [], "length", 0, 6, "e", 0, 0,
                          Routing(LAYERS, TOP_K, "uint8", rows[:9].tobytes()), 0)
    ledger.record("r", tokens, 6, 4, good)
    assert ledger.missing_prefix("r", tokens) == 0
    # a second request whose chunk came back without routing: its tokens must be recomputed
    other = [1, 2, 3, 4, 5, 6, 99, 98]
    ledger.record("q", other, 6, 2, GenerateResult("q-c0", other[6:], [], "length", 6, 6, "e", 0, 0))
    assert ledger.missing_prefix("q", other) == 7  # positions 0..5 are shared with "r"; 6 is q's own
    with pytest.raises(RoutingIncomplete, match="no routing for 1 of 8 tokens"):
        ledger.routing_of("q", other)
    assert ledger.counts["chunks_without_routing"] == 1


def test_rows_of_tokens_a_turn_cut_dropped_never_stand_for_the_tokens_that_replace_them():
    ledger = RoutingLedger()
    engine_seq = [1, 2, 3, 4, 5, 6, 7, 8]  # the engine generated 4 tokens after a 4-token prompt ...
    rows = expected(engine_seq)
    kept_seq = engine_seq[:6]  # ... the turn kept 2 of them
    ledger.record("r", kept_seq, 4, 2, GenerateResult("r-c0", engine_seq[4:], [], "stop", 0, 4, "e", 0, 0,
                                                    Routing(LAYERS, TOP_K, "uint8", rows[:7].tobytes()), 0))
    later = kept_seq + [50, 51]  # an observation now sits where the dropped tokens were
    assert ledger.missing_prefix("r", later) == 7  # position 6 must come from the next prefill, not the cut rows


def test_the_worker_row_store_keeps_the_newest_contiguous_rows_by_position():
    from seer.fleet.routing_ext import _Rows

    r = _Rows(5, 5, np.zeros((2, 1, 1), np.uint8), 0.0)
    r.write(5, np.array([1, 2, 3], np.uint8).reshape(3, 1, 1), 0.0)  # a prefill from position 5 (5 were cached)
    r.write(8, np.array([4], np.uint8).reshape(1, 1, 1), 0.0)
    r.write(7, np.array([9, 10], np.uint8).reshape(2, 1, 1), 0.0)  # recomputed (a rejected draft): newest wins
    assert (r.lo, r.hi) == (5, 9) and r.buf[:4, 0, 0].tolist() == [1, 2, 9, 10]
    r.write(3, np.array([7, 8], np.uint8).reshape(2, 1, 1), 0.0)  # preempted, recomputed from further back
    assert (r.lo, r.hi) == (3, 5)
    r.write(20, np.array([5], np.uint8).reshape(1, 1, 1), 0.0)  # a gap (a lost step): no zeros stand in for it
    assert (r.lo, r.hi) == (20, 21)


def test_routing_replay_is_refused_for_a_dense_checkpoint_and_accepted_for_an_moe_one(tmp_path):
    import json

    from seer.config import ConfigError
    from seer.job import _check_routing_replay
    from seer.trainer.config import TrainerConfig

    assert TrainerConfig().routing_replay is False  # off by default: no capture, no cost
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 2}))
    with pytest.raises(ConfigError, match="routing_replay: true needs a mixture-of-experts model.*dense qwen2"):
        _check_routing_replay(tmp_path)
    # capturing without replay (the routing-difference metrics) starts the same capture
    assert TrainerConfig(routing_capture=True).captures_routing and not TrainerConfig().captures_routing
    with pytest.raises(ConfigError, match="routing_capture: true needs a mixture-of-experts model"):
        _check_routing_replay(tmp_path, "routing_capture")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8}))
    _check_routing_replay(tmp_path)


def test_the_trainer_takes_a_samples_routing_only_with_one_row_per_prompt_and_response_token():
    from seer.trainer.trainer import _checked_routing
    from seer.types import Sample

    spec = PromptSpec(0, "", [1, 2, 3], {})
    full = Routing(LAYERS, TOP_K, "uint8", bytes(5 * LAYERS * TOP_K))
    s = Sample(0, 0, "g0-s0", spec, [7, 8], [-0.1, -0.2], "stop", 0.0, 1.0, ["e0"], routing=full)
    assert _checked_routing(s, True) is full
    # replay off: the trainer routes by itself, and keeps the routing for the difference metrics
    assert _checked_routing(s, False) is full
    s.routing = Routing(LAYERS, TOP_K, "uint8", bytes(4 * LAYERS * TOP_K))
    assert _checked_routing(s, False) is None  # misaligned: not compared with anything
    with pytest.raises(ValueError, match="routing for 4 tokens, not its 5 prompt"):
        _checked_routing(s, True)
    s.routing = None
    with pytest.raises(ValueError, match="routing for None tokens"):
        _checked_routing(s, True)
