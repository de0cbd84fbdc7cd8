"""Environment calls in real worker processes: a hanging step times out into an error observation
without stalling the others; a raising one is counted (and ends the trajectory when so configured)."""

from __future__ import annotations

import asyncio

import pytest

from seer.config import ConfigError, load_config
from seer.tasks.env import EnvConfig, EnvRunner, Observation, Turn

ECHO = "tests.multiturn.envs_for_tests:EchoEnv"


def turn(k: int) -> Turn:
    return Turn(k, "<c>1</c>", (1, 2), "stop_sequence")


@pytest.mark.timeout(120)
def test_a_hanging_step_times_out_into_an_error_observation_and_the_others_go_on():
    runner = EnvRunner("tests.multiturn.envs_for_tests:HangingEnv", EnvConfig(timeout_s=5.0, workers=3))

    async def go():
        for k in ("a", "b", "c"):
            await runner.start(k, "p", {"hang": k == "a"})
        hung = asyncio.ensure_future(runner.step("a", turn(1)))
        fast = [await runner.step(k, turn(1)) for k in ("b", "c")]
        hung_first = hung.done()  # (it can only end by its timeout)
        return await hung, fast, hung_first, await runner.step("a", turn(2))

    try:
        hung, fast, hung_first, after = asyncio.run(go())
    finally:
        runner.close()
    assert not hung_first  # the others were answered while it hung: not stuck behind the hung call
    assert all(r.error is None and r.observation == Observation(token_ids=(61, 61, 10)) for r in fast)
    assert hung.error.startswith("TimeoutError") and not hung.done and "error" in hung.observation.text
    assert after.error is None and not after.done  # the environment goes on from its state before the hung step
    assert runner.stats.timeouts == 1 and runner.stats.errors == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_error", ["observe", "end"])
def test_a_raising_step_is_counted_and_behaves_as_configured(on_error):
    runner = EnvRunner("tests.multiturn.envs_for_tests:RaisingEnv", EnvConfig(on_error=on_error, workers=1))

    async def go():
        first = await runner.start("a", "p", {})
        return first, [await runner.step("a", turn(k)) for k in (1, 2)]

    try:
        first, (ok, raised) = asyncio.run(go())
    finally:
        runner.close()
    assert first.observation == Observation(token_ids=(62,)) and ok.error is None
    assert "RuntimeError: tool crashed" in raised.error and runner.stats.errors == 1
    if on_error == "observe":
        assert not raised.done and "tool crashed" in raised.observation.text
    else:
        assert raised.done and raised.reward == 0.0


@pytest.mark.parametrize("override, key", [
    ("task.env=tests.multiturn.envs_for_tests:NoSuchEnv", "task.env"),
    ("task.env=nosuch", "task.env"),
    ("env.max_turns=0", "env.max_turns"),
    ("env.timeout_s=-1", "env.timeout_s"),
    ("task.env_args={x: 1}", "task.env_args"),
])
def test_bad_environment_settings_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[override] + (["task.env=" + ECHO] if override.startswith("task.env_args") else []))


def test_an_environment_without_step_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"task\.env .*NoStepEnv has no step"):
        load_config(overrides=["task.env=tests.multiturn.envs_for_tests:NoStepEnv"])


def test_the_calculator_task_selects_its_model_and_multi_turn_rollout():
    from seer.job import MULTI_TURN_ROLLOUT, rollout_function

    cfg = load_config(overrides=["task.name=calculator"])
    assert cfg.model.preset == "calc" and rollout_function(cfg) == MULTI_TURN_ROLLOUT
    assert load_config(overrides=["task.name=calculator", "model.preset=tiny"]).model.preset == "tiny"
    assert rollout_function(load_config()) == "seer.rollout.single_turn:single_turn_rollout"
    assert rollout_function(load_config(overrides=["task.env=" + ECHO])) == MULTI_TURN_ROLLOUT
