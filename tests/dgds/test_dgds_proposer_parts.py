"""The proposer's vLLM-free parts: request-id parsing, settings, the online Algorithm 1 inputs,
vLLM's metrics parsing, and the offline acceptance simulation (against a brute-force replay)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seer.dgds.acceptance_sim import accepted_prefix, ngram_accepted_at, replay, tree_accepted_at
from seer.dgds.adaptive import AdaptiveDraftLength, StepCost
from seer.dgds.proposer_settings import settings_from
from seer.dgds.request_ids import caller_request_id, parse_request_id
from seer.dgds.types import DraftParams
from seer.dgds.vllm_metrics import spec_decode_counters
from seer.scheduler.chunks import chunk_request_id

# ---- request ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "engine_id, caller",
    [
        ("cmpl-it3-g5-s2-c1-0-1a2b3c4d", "it3-g5-s2-c1"),  # OpenAI completions
        ("chatcmpl-it3-g5-s2-0a0b0c0d", "it3-g5-s2"),  # chat completions
        ("it3-g5-s2-deadbeef", "it3-g5-s2"),  # offline engine
        ("cmpl-a-b-c-12-99999999", "a-b-c"),
    ],
)
def test_caller_id_is_recovered_from_vllm_wrappings(engine_id, caller):
    assert caller_request_id(engine_id) == caller


def test_scheduler_ids_map_to_their_group_and_chunk_sequence():
    rid = chunk_request_id("it3-g5-s2", 1) + "-r1"  # the dispatcher's retry of chunk 1
    ref = parse_request_id(f"cmpl-{rid}-0-abcdef01")
    assert (ref.group_id, ref.sequence_id, ref.sample_index, ref.chunk_index) == ("it3-g5", rid, 2, 1)
    assert ref.grouped and not ref.first_chunk and not ref.probe
    probe = parse_request_id(f"cmpl-{chunk_request_id('it3-g5-s0', 0)}-0-abcdef01")
    assert probe.probe and probe.first_chunk and probe.group_id == "it3-g5"
    # sibling samples and chunks share the group; other iterations do not
    assert parse_request_id("cmpl-it3-g5-s7-0-00000000").group_id == "it3-g5"
    assert parse_request_id("cmpl-it4-g5-s7-0-00000000").group_id == "it4-g5"


def test_foreign_ids_and_solo_ids_draft_per_request():
    ref = parse_request_id("cmpl-my-framework-req-42-0-0123abcd")
    assert ref.group_id == "req:my-framework-req-42" and not ref.grouped and not ref.probe
    solo = parse_request_id("cmpl-solo-it3-g5-s2-c0-0-0123abcd")
    assert not solo.grouped and solo.group_id == "req:it3-g5-s2" and solo.sequence_id == "it3-g5-s2-c0"
    # per-request mode: every chunk of one request shares a tree, other samples never do
    a = parse_request_id("cmpl-it3-g5-s2-c0-0-0123abcd", per_request=True)
    b = parse_request_id("cmpl-it3-g5-s2-c3-0-0123abcd", per_request=True)
    c = parse_request_id("cmpl-it3-g5-s1-c0-0-0123abcd", per_request=True)
    assert a.group_id == b.group_id != c.group_id


# ---- settings --------------------------------------------------------------------------------


def test_settings_from_spec_config_and_env():
    s = settings_from(6, 32, 0.2, env={"SEER_DGDS_ADDRESS": "127.0.0.1:1", "SEER_DGDS_MODE": "request",
                                        "SEER_DGDS_ADAPTIVE": "0"})
    assert (s.address, s.per_request, s.gamma_max, s.pattern_lookup_max, s.min_token_prob, s.adaptive) == (
        "127.0.0.1:1", True, 6, 32, 0.2, False)
    assert settings_from(8, env={}).address is None  # embedded server
    with pytest.raises(ValueError, match="SEER_DGDS_MODE"):
        settings_from(8, env={"SEER_DGDS_MODE": "groups"})
    with pytest.raises(ValueError, match="bad SEER_DGDS"):
        settings_from(8, env={"SEER_DGDS_LAMBDA": "two"})


# ---- Algorithm 1's online inputs ----------------------------------------------------------------


def test_step_cost_recovers_a_linear_step_time():
    cost = StepCost(decay=1.0)
    rng = random.Random(0)
    for _ in range(200):
        tokens = rng.randint(1, 300)
        cost.observe(tokens, 0.010 + 0.0002 * tokens)
    fixed, slope = cost.coefficients()
    assert fixed == pytest.approx(0.010, rel=1e-6) and slope == pytest.approx(0.0002, rel=1e-6)
    assert cost.verify_time(10, 3) == pytest.approx(0.010 + 0.0002 * 40)


def test_policy_warms_up_then_stops_speculating_when_nothing_is_accepted():
    pol = AdaptiveDraftLength(gamma_max=8, warmup_drafts=10, explore_every=4)
    first = pol.lengths(2, 6)
    assert (first.high, first.low) == (8, 8)  # warm-up: beta unknown, draft gamma_max
    for _ in range(50):
        pol.record_step(8 * 9, 0.02)
        pol.record_verified(8, 0)
    plans = [pol.lengths(2, 6) for _ in range(8)]
    assert sum(1 for p in plans if (p.high, p.low) == (0, 0)) == 6  # only exploration steps draft
    assert sum(1 for p in plans if p.high == 8) == 2


def test_policy_drafts_long_when_drafts_are_accepted_and_steps_are_cheap():
    pol = AdaptiveDraftLength(gamma_max=8, warmup_drafts=10)
    for i in range(200):
        pol.record_step(1 + i % 50, 0.02)  # step time independent of tokens: verifying is free
        pol.record_verified(8, 7)
    plan = pol.lengths(2, 6)
    assert plan.high == 8 and plan.low >= 6


# ---- vLLM metrics ---------------------------------------------------------------------------------

METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 60.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
"""


def test_spec_decode_counters_parse_and_diff():
    c = spec_decode_counters(METRICS)
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (10, 60, 15)
    assert c.mean_acceptance_length == pytest.approx(2.5) and c.acceptance_rate == pytest.approx(0.25)
    assert (c - c).mean_acceptance_length is None


# ---- offline acceptance simulation ---------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=0, max_size=40))
def test_replay_counts_every_token_once(accepted):
    r = replay(accepted)
    assert r.tokens == len(accepted)
    assert (r.steps == 0) == (len(accepted) == 0)
    if all(a == 0 for a in accepted):
        assert r.steps == len(accepted)


def test_acceptance_of_a_copy_of_a_reference_is_the_draft_length():
    rng = random.Random(1)
    resp = [rng.randrange(50) for _ in range(200)]
    params = {"linear": DraftParams(max_spec_tokens=4, min_token_prob=0.0)}
    with_copy = replay(tree_accepted_at([], resp, [resp], params)["linear"])
    alone = replay(tree_accepted_at([], resp, [], params)["linear"])
    assert with_copy.mean_acceptance_length > 4.5  # nearly every step: 4 drafted + the bonus
    assert alone.mean_acceptance_length < 1.3  # random tokens: own history predicts little


def test_ngram_is_scored_with_vllms_own_matcher():
    resp = [1, 2, 3, 4] * 10
    acc = ngram_accepted_at([9, 9], resp, k=3, lookup_min=1, lookup_max=3)
    assert acc[:4] == [0, 0, 0, 0] and all(a == 3 for a in acc[5:-3])
    assert accepted_prefix([1, 2, 5], [1, 2, 3]) == 2
