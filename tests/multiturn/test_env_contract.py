"""An environment's output that breaks its contract (a reward of 10**400, `Observation(token_ids=5)`, a
token id outside the tokenizer's vocabulary) costs its own trajectory only, with the error recorded
on its sample; NumPy's scalars are rewards like any number. Real worker processes (env.mode: process)
and the real scheduler driver, on the scripted engine of tests/multiturn/test_turns.py (no vLLM)."""

from __future__ import annotations

import pytest

from seer.tasks.env import EnvConfig
from seer.types import PromptSpec
from seer.metrics_log import iteration_record
from tests.multiturn.test_turns import decode, run_multi_turn
from tests.test_metrics_fields import undocumented

VOCAB = 200  # the scripted engine's tokens are characters below it
BROKEN = {  # how -> what the sample's reward_error says
    "huge_reward": "StepResult.reward: step (done) returned 1000000000",
    "nan_reward": "StepResult.reward: step (done) returned nan",
    "bool_reward": "StepResult.reward: step (done) returned True (bool)",
    "int_ids": "Observation.token_ids must be a sequence of int token ids, got int",
    "str_ids": "Observation.token_ids must be a sequence of int token ids, got str",
    "big_id": "Observation.token_ids[1] is 1000000, not a token id (the tokenizer's ids are 0..199)",
    "negative_id": "Observation.token_ids[0] is -1, not a token id",
    "text_not_str": "Observation.text must be a str, got int",
}
KEPT = {"np_f32_reward": 0.5, "np_i64_reward": 2.0, "np_ids": 1.0, "fine": 1.0}


def rollout(on_error: str, max_tokens: int = 60):
    hows = [*BROKEN, *KEPT]
    prompts = [PromptSpec(i, f"p{i}", [100 + i] * 3, {"how": how}) for i, how in enumerate(hows)]
    batch = run_multi_turn(EnvConfig(on_error=on_error, workers=4), None, max_tokens,
                           env="tests.multiturn.envs_for_tests:ContractEnv", prompt_specs=prompts, vocab_size=VOCAB)
    return hows, batch


@pytest.mark.timeout(120)
def test_environment_output_that_breaks_the_contract_costs_only_its_own_trajectory_with_its_error_recorded():
    hows, batch = rollout("end")
    assert len(batch.samples) == 2 * len(hows)  # the iteration finished: no sample lost
    for s in batch.samples:
        how = hows[s.group_id]
        if how in BROKEN:
            assert s.reward == 0.0 and s.failure == "environment", (how, s.reward, s.reward_error)
            assert s.reward_error == f"turn 1: {BROKEN[how]}" or s.reward_error.startswith(f"turn 1: {BROKEN[how]}"), \
                (how, s.reward_error)
            assert len(s.reward_error) < 300  # 10**400's 401 digits are not quoted whole
        else:
            assert s.reward == KEPT[how] and s.reward_error is None and s.failure is None, (how, s.reward_error)
    np_ids = [s for s in batch.samples if hows[s.group_id] == "np_ids"]
    assert all(s.response_ids.count(61) >= 2 and s.turns == 2 for s in np_ids)  # NumPy's ids were appended
    assert batch.stats.extra["env_errors"] == 2 * len(BROKEN)
    rec = iteration_record(batch)
    assert undocumented(rec) == [] and rec["reward_errors"] == 2 * len(BROKEN)  # docs/watching.md names every field


@pytest.mark.timeout(120)
def test_a_bad_observation_under_observe_is_an_error_observation_and_a_bad_final_reward_still_ends_it():
    hows, batch = rollout("observe", max_tokens=300)  # room for the error observation
    assert len(batch.samples) == 2 * len(hows)
    for s in batch.samples:
        how = hows[s.group_id]
        if how.endswith("_reward") and how in BROKEN:  # the environment said done: nothing to continue
            assert s.reward == 0.0 and BROKEN[how] in s.reward_error and s.turns == 1, (how, s.reward_error)
        elif how in BROKEN:  # the model saw the error and the trajectory went on to its reward
            assert s.reward == 1.0 and s.reward_error is None and s.turns == 2, (how, s.reward_error)
            assert BROKEN[how] in decode(s.response_ids), how
    assert any(BROKEN["int_ids"] in m or BROKEN["huge_reward"][:30] in m
               for m in batch.stats.extra["env_error_messages"])
