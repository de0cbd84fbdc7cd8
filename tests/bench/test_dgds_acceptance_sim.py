"""bench/harness/dgds_acceptance_sim.py: offline acceptance of drafts on recorded token streams."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.harness.dgds_acceptance_sim import accepted_prefix, ngram_accepted_at, replay, tree_accepted_at
from seer.dgds.types import DraftParams




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
