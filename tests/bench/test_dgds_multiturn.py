"""The multi-turn acceptance replay scores model tokens only, never drafts past a turn's end, and
keeps observations out of the tree unless asked (bench/dgds_multiturn.py)."""

from bench.harness.dgds_acceptance_sim import turns_accepted_at
from seer.dgds.types import DraftParams

P = DraftParams(max_spec_tokens=8, pattern_lookup_max=24, min_token_prob=0.0)
PROMPT = [1, 2, 3]
# turn 1: 10 11 12, observation 20 21, turn 2: 13 14 15 16
IDS = [10, 11, 12, 20, 21, 13, 14, 15, 16]
MASK = [1, 1, 1, 0, 0, 1, 1, 1, 1]


def test_scores_each_model_token_of_each_turn_and_stops_at_the_turn_end():
    for obs in (False, True):
        turns = turns_accepted_at(PROMPT, IDS, MASK, [(IDS, MASK)], P, observations=obs)
        assert [len(t) for t in turns] == [3, 4]
        # a sibling identical to it: every draft is right, up to the end of its turn only (the
        # first token follows the prompt, which no sibling's sequence holds)
        assert turns[0] == [0, 2, 1] and turns[1][1:] == [3, 2, 1]


def test_observations_in_the_tree_or_not():
    # right after the observation the context ends in 20 21: only a tree that holds observations
    # knows what follows them
    without = turns_accepted_at(PROMPT, IDS, MASK, [(IDS, MASK)], P, observations=False)
    with_obs = turns_accepted_at(PROMPT, IDS, MASK, [(IDS, MASK)], P, observations=True)
    assert without[1][0] == 0 and with_obs[1][0] == 4
    # no references: nothing of the group to draft from at the first turn's start
    assert turns_accepted_at(PROMPT, IDS, MASK, [], P, observations=True)[0][0] == 0
