"""The proposer's vLLM-free parts: request-id parsing, settings, the online Algorithm 1 inputs,
and vLLM's metrics parsing."""

from __future__ import annotations

import random

import pytest

from seer.dgds.policy.adaptive import AdaptiveDraftLength, StepCost
from seer.dgds.vllm import PROPOSER, speculative_config
from seer.procs.vllm_metrics import spec_decode_counters
from seer.dgds.vllm.settings import settings_from
from seer.request_ids import SeerId, caller_request_id, chunk_id, parse, parse_request_id, request_id

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
    rid = chunk_id(request_id(5, 2, "it3-"), 1, retry=1)  # the dispatcher's retry of chunk 1
    ref = parse_request_id(f"cmpl-{rid}-0-abcdef01")
    assert (ref.group_id, ref.sequence_id, ref.sample_index, ref.chunk_index) == ("it3-g5", rid, 2, 1)
    assert ref.grouped and not ref.first_chunk and not ref.probe
    probe = parse_request_id(f"cmpl-{chunk_id('it3-g5-s0', 0)}-0-abcdef01")
    assert probe.probe and probe.first_chunk and probe.group_id == "it3-g5"
    # sibling samples and chunks share the group; other iterations do not
    assert parse_request_id("cmpl-it3-g5-s7-0-00000000").group_id == "it3-g5"
    assert parse_request_id("cmpl-it4-g5-s7-0-00000000").group_id == "it4-g5"


def test_ids_are_built_and_parsed_by_one_grammar():
    rid = request_id(5, 2, "it3-")
    assert rid == "it3-g5-s2" and chunk_id(rid, 4) == "it3-g5-s2-c4" and chunk_id(rid, 4, 2) == "it3-g5-s2-c4-r2"
    assert parse(chunk_id(rid, 4, 2)) == SeerId("it3-", 5, 2, 4, 2)
    assert parse(rid) == SeerId("it3-", 5, 2) and parse(rid).request == rid and parse(rid).group == "it3-g5"
    assert parse(request_id(0, 1)) == SeerId("", 0, 1)
    assert parse("my-framework-req-42") is None


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


# ---- settings ----------------------------------------------------------------------------------


def test_the_speculative_config_names_the_proposer_class():
    import json

    from seer.dgds.vllm.proposer import DgdsProposer

    assert PROPOSER == f"{DgdsProposer.__module__}.{DgdsProposer.__qualname__}"
    assert json.loads(speculative_config(6)) == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 6}


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
        pol.record_verified(8, 8)  # every drafted position accepted
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
