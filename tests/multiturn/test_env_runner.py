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


UNRULY = "tests.multiturn.envs_for_tests:UnrulyEnv"


def _run(runner: EnvRunner, go):
    """asyncio.run(go()), or the test fails (old code let SystemExit and KeyboardInterrupt end it)."""
    try:
        return asyncio.run(go())
    except BaseException as e:
        pytest.fail(f"user code ended the rollout: {type(e).__name__}: {e}")
    finally:
        runner.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_step_that_exits_interrupts_or_kills_its_worker_is_only_that_trajectorys_error(mode):
    """sys.exit(0) or KeyboardInterrupt in a step used to end seer-run; os._exit broke the process
    pool for every later step. Now each is its trajectory's error and the others go on."""
    log: list[str] = []
    runner = EnvRunner(UNRULY, EnvConfig(mode=mode, workers=2), log=log.append)
    hows = ["exit", "interrupt", "die", None] if mode == "process" else ["exit", "interrupt", None]

    async def go():
        for k, how in enumerate(hows):
            await runner.start(str(k), "p", {"step": how})
        # one at a time: a call in a pool that another call breaks runs once again, then fails
        bad = [await runner.step(str(k), turn(1)) for k in range(len(hows) - 1)]
        good = [await runner.step(str(len(hows) - 1), turn(k)) for k in (1, 2, 3)]
        return bad, good

    bad, good = _run(runner, go)
    errors = [r.error for r in bad]
    assert errors[:2] == ["SystemExit: 0", "KeyboardInterrupt: "]
    assert all(not r.done and r.observation.text.startswith("[custom: ") for r in bad)  # its error_observation
    assert [r.error for r in good] == [None] * 3 and good[-1].done and good[-1].reward == 3.0
    if mode == "process":
        assert errors[2].startswith("BrokenProcessPool")
        assert runner.stats.pools_broken == 2 and "environment workers: a worker process died" in log[0]
    assert runner.stats.errors == len(hows) - 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_an_environment_constructor_is_bounded_and_guarded(mode):
    """The constructor ran on the event loop with no bound: one that hung stalled the rollout,
    one that called sys.exit ended it. Now it runs in a worker within env.init_timeout_s."""
    runner = EnvRunner(UNRULY, EnvConfig(mode=mode, workers=3, init_timeout_s=3.0))

    async def go():
        return await asyncio.gather(*(runner.start(k, "p", {"init": k}) for k in ("hang", "exit", "fine")))

    hung, exited, fine = _run(runner, go)
    assert hung.done and hung.reward == 0.0 and hung.error == "TimeoutError: UnrulyEnv() took longer than 3.0 s"
    assert exited.done and exited.error == "SystemExit in UnrulyEnv(): 0"
    assert fine.error is None and fine.observation == Observation(token_ids=(62,))
    assert runner.stats.errors == 2 and runner.stats.calls == 1  # one reset; constructors are not calls


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["hang", "raise"])
def test_an_error_observation_that_hangs_or_raises_gives_the_default_one(how):
    """error_observation ran unguarded on the event loop; now in a worker within env.timeout_s,
    and when it fails too the model sees the default error observation."""
    runner = EnvRunner(UNRULY, EnvConfig(timeout_s=3.0, workers=1))

    async def go():
        await runner.start("a", "p", {"step": "raise", "error_observation": how})
        return await runner.step("a", turn(1))

    reply = _run(runner, go)
    assert reply.error == "RuntimeError: tool crashed" and not reply.done
    assert reply.observation == Observation(text="\n[error: RuntimeError: tool crashed]\n")


def test_environment_calls_are_bounded_by_default():
    from seer.tasks.workers import BOUNDS

    cfg = load_config().env
    assert (cfg.timeout_s, cfg.init_timeout_s) == (BOUNDS.env_call_s, BOUNDS.env_init_s) == (10.0, 60.0)


@pytest.mark.parametrize("override, key", [
    ("task.env=tests.multiturn.envs_for_tests:NoSuchEnv", "task.env"),
    ("task.env=nosuch", "task.env"),
    ("env.max_turns=0", "env.max_turns"),
    ("env.timeout_s=-1", "env.timeout_s"),
    ("env.init_timeout_s=0", "env.init_timeout_s"),
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
