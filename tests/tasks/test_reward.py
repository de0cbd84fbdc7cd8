import asyncio
import time

import pytest

from seer.types import PromptSpec, Sample
from seer.tasks import RewardAborted, RewardRunner, RewardSpecError, resolve_reward_fn

MOD = "tests.tasks.rewards_for_tests"


def _sample(text: str, answer=4, i=0) -> Sample:
    prompt = PromptSpec(index=i, text="2+2=", prompt_ids=[1], reference={"answer": answer})
    return Sample(
        group_id=i, sample_index=0, request_id=f"r{i}", prompt=prompt, response_ids=[5, 6], logprobs=[0.0, 0.0],
        finish_reason="stop", start_time=0.0, finish_time=0.0, instances=["i0"], response_text=text,
    )


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("no_colon", "must look like"),
        ("a:b:c", "must look like"),
        (":fn", "must look like"),
        ("seer.no_such_module:fn", "cannot import module 'seer.no_such_module'"),
        (f"{MOD}:missing", "has no attribute 'missing'"),
        (f"{MOD}:NOT_CALLABLE", "not a function"),
    ],
)
def test_bad_reward_spec_is_a_clear_error(spec, expected):
    with pytest.raises(RewardSpecError, match=expected):
        resolve_reward_fn(spec)


def test_runner_scores_right_and_wrong_answers():
    async def go():
        with RewardRunner(f"{MOD}:exact") as runner:
            for i, text in enumerate(["4", "5", " 4 "]):
                runner.submit(_sample(text, i=i))
            return await runner.wait_all()

    assert [s.reward for s in asyncio.run(go())] == [1.0, 0.0, 1.0]


def test_raising_reward_marks_the_sample_and_scores_zero():
    async def go():
        with RewardRunner(f"{MOD}:boom", on_error="zero") as runner:
            runner.submit(_sample("4"))
            done = await runner.wait_all()
            return done, runner.stats

    (s,), stats = asyncio.run(go())
    assert s.reward == 0.0
    assert "ValueError: reward exploded" in s.reward_error
    assert stats.errors == 1 and stats.scored == 1


def test_non_numeric_reward_is_an_error():
    async def go():
        with RewardRunner(f"{MOD}:not_a_number") as runner:
            return await runner.score(_sample("4"))

    s = asyncio.run(go())
    assert s.reward == 0.0 and "expected a finite real number" in s.reward_error


ACCEPTED = {"np_float32": 0.5, "np_int64": 2.0, "np_float16": 0.25, "fraction": 0.25, "decimal": 0.75, "int": 3.0,
            "float": 1.5}
REFUSED = ["bool", "np_bool", "nan", "np_inf", "huge", "complex", "str", "none"]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_reward_of_any_real_number_type_scores_and_bool_nan_inf_and_overflow_are_errors(mode):
    """np.float32 and np.int64 rewards were scored as errors; 10**400 raised OverflowError."""
    texts = [*ACCEPTED, *REFUSED]

    async def go():
        with RewardRunner(f"{MOD}:typed", use_processes=mode == "process") as runner:
            for i, text in enumerate(texts):
                runner.submit(_sample(text, i=i))
            return await runner.wait_all()

    scored = {s.response_text: s for s in asyncio.run(go())}
    for text, value in ACCEPTED.items():
        s = scored[text]
        assert s.reward == value and type(s.reward) is float and s.reward_error is None, (text, s.reward_error)
    for text in REFUSED:
        s = scored[text]
        assert s.reward == 0.0 and s.failure == "reward", text
        assert "expected a finite real number" in s.reward_error or "not a float" in s.reward_error, (text, s.reward_error)
        assert len(s.reward_error) < 300, text  # 10**400 is not quoted whole


def test_abort_policy_raises_with_the_sample():
    async def go():
        with RewardRunner(f"{MOD}:boom", on_error="abort") as runner:
            runner.submit(_sample("4", i=3))
            await runner.wait_all()

    with pytest.raises(RewardAborted, match="prompt 3") as e:
        asyncio.run(go())
    assert e.value.sample.reward_error is not None


def test_rewards_run_off_the_event_loop():
    """A slow reward must not stall the loop: the rollout keeps generating meanwhile. Four rewards
    run at once (each waits at a barrier for the other three, which in series would never come),
    and they finish only when the loop, still turning while they block, releases them."""
    import threading

    all_running = threading.Barrier(4, timeout=60)
    running: list[int] = []
    release = threading.Event()

    def slow(text, ref):
        all_running.wait()
        running.append(1)
        if not release.wait(60):
            raise TimeoutError("the event loop never released the rewards: it was blocked")
        return 1.0

    async def go():
        with RewardRunner(slow, max_workers=4) as runner:
            for i in range(4):
                runner.submit(_sample("4", i=i))
            deadline = time.monotonic() + 60
            while len(running) < 4 and time.monotonic() < deadline:  # the loop turns while they block
                await asyncio.sleep(0.01)
            release.set()
            return await runner.wait_all()

    done = asyncio.run(go())
    assert [(s.reward, s.reward_error) for s in done] == [(1.0, None)] * 4


def test_timeout_marks_the_sample():
    def hang(text, ref):
        time.sleep(0.5)
        return 1.0

    async def go():
        with RewardRunner(hang, timeout_s=0.05) as runner:
            return await runner.score(_sample("4"))

    assert "TimeoutError" in asyncio.run(go()).reward_error


def test_decode_fills_missing_text():
    async def go():
        with RewardRunner(f"{MOD}:exact", decode=lambda ids: "4") as runner:
            return await runner.score(_sample(""))

    assert asyncio.run(go()).reward == 1.0


def test_process_pool_needs_a_spec_and_works_with_one():
    with pytest.raises(ValueError, match="spec"):
        RewardRunner(lambda t, r: 1.0, use_processes=True)

    async def go():
        with RewardRunner("seer.tasks.running_sum:score", use_processes=True, max_workers=1) as runner:
            s = _sample("-9=0011\n-9=0002\n-2=0000\n")
            s.prompt = PromptSpec(0, "", [1], {"total": 20})
            return await runner.score(s)

    assert asyncio.run(go()).reward == 1.0


# -- per-sample timeout (rollout.reward_timeout_s), thread and process mode --------------------------------

def _runner(mode: str, on_error: str, timeout_s: float = 0.5, workers: int = 1) -> RewardRunner:
    """Built from the run config's rollout.reward_* keys, as the loop builds it."""
    from seer.config import load_config
    cfg = load_config(overrides=[f"rollout.reward_mode={mode}", f"rollout.reward_timeout_s={timeout_s}",
                                 f"rollout.reward_workers={workers}", f"rollout.reward_error_policy={on_error}"])
    return cfg.rollout.reward_runner(f"{MOD}:exact_or_hang")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_reward_past_the_timeout_scores_zero_and_frees_its_worker(mode):
    async def go(runner):
        runner.submit(_sample("hang", i=0))  # first, on the only worker
        for i in range(1, 4):
            runner.submit(_sample("4", i=i))
        t0 = time.monotonic()
        done = await runner.wait_all()
        return done, time.monotonic() - t0

    runner = _runner(mode, "zero")
    try:
        done, took = asyncio.run(go(runner))
    finally:
        t0 = time.monotonic()
        runner.close()
        close_s = time.monotonic() - t0
    hung, *rest = done
    assert hung.reward == 0.0 and "TimeoutError" in hung.reward_error and "0.5 s" in hung.reward_error
    assert [s.reward for s in rest] == [1.0, 1.0, 1.0] and all(s.reward_error is None for s in rest)
    assert runner.stats.errors == 1 and runner.stats.scored == 4
    assert took < 10  # the hung call (120 s) held up nothing: its worker was freed (process: replaced)
    assert close_s < 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_reward_past_the_timeout_under_abort_stops_the_iteration(mode):
    async def go(runner):
        runner.submit(_sample("4", i=0))
        runner.submit(_sample("hang", i=1))
        await runner.wait_all()

    runner = _runner(mode, "abort", workers=2)
    t0 = time.monotonic()
    try:
        with pytest.raises(RewardAborted, match="prompt 1.*TimeoutError"):
            asyncio.run(go(runner))
    finally:
        runner.close()
    assert time.monotonic() - t0 < 15
    assert runner.stats.errors == 1


def test_reward_settings_are_validated_naming_the_key():
    from seer.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="rollout.reward_timeout_s"):
        load_config(overrides=["rollout.reward_timeout_s=0"])
    with pytest.raises(ConfigError, match="rollout.reward_mode"):
        load_config(overrides=["rollout.reward_mode=fork"])
    with pytest.raises(ConfigError, match="task.reward 'nope:f': cannot import module 'nope'"):
        load_config(overrides=["task.reward=nope:f"])
    cfg = load_config()
    assert (cfg.rollout.reward_mode, cfg.rollout.reward_timeout_s) == ("thread", 300.0)
    assert load_config(overrides=["rollout.reward_timeout_s=null"]).rollout.reward_timeout_s is None


def test_a_reward_is_bounded_by_default():
    """A hung reward used to stall the run forever (reward_timeout_s defaulted to none): now the
    run config and the runner itself default to UserCodeBounds' generous 300 s."""
    from seer.config import load_config
    from seer.tasks.workers import BOUNDS

    assert BOUNDS.reward_s == 300.0
    with load_config().rollout.reward_runner(f"{MOD}:exact") as runner:
        assert runner.timeout_s == BOUNDS.reward_s and runner._workers.timeout_s == BOUNDS.reward_s
    with RewardRunner(f"{MOD}:exact") as runner:
        assert runner.timeout_s == BOUNDS.reward_s


# -- user code that ends its process or the program (a reward is never the end of the run) --------------

def _score_all(runner: RewardRunner, samples: list[Sample], sequential: bool = False) -> list[Sample]:
    """Every sample scored, or the test fails (instead of ending: old code let SystemExit and
    KeyboardInterrupt through to pytest)."""
    async def go():
        if sequential:
            return [await runner.score(s) for s in samples]
        for s in samples:
            runner.submit(s)
        return await runner.wait_all()

    try:
        return asyncio.run(go())
    except BaseException as e:
        pytest.fail(f"user code ended the scoring: {type(e).__name__}: {e}")


@pytest.mark.timeout(120)
def test_a_reward_worker_that_dies_has_its_pool_replaced_and_later_rewards_score(tmp_path):
    """One os._exit in a reward broke the process pool for the rest of the run (every later reward
    an error). Now the pool is replaced, counted and logged, and the call runs once again."""
    log: list[str] = []
    ref = {"answer": 4, "flag": str(tmp_path / "died")}
    samples = [_sample("4", i=i) for i in range(4)]
    for s in samples:
        s.prompt = PromptSpec(s.prompt.index, "", [1], ref)
    with RewardRunner(f"{MOD}:exit_once", use_processes=True, max_workers=1, log=log.append) as runner:
        done = _score_all(runner, samples, sequential=True)
    assert (tmp_path / "died").exists()  # the first call did kill its worker
    assert [s.reward for s in done] == [1.0] * 4 and all(s.reward_error is None for s in done)
    assert runner.stats.pools_broken == 1 and runner.stats.errors == 0
    assert len(log) == 1 and "reward workers: a worker process died" in log[0] and "1 so far" in log[0]


@pytest.mark.timeout(120)
def test_a_reward_that_always_kills_its_worker_is_that_samples_error_only():
    log: list[str] = []
    samples = [_sample("die", i=0), *(_sample("4", i=i) for i in range(1, 4))]
    with RewardRunner(f"{MOD}:dies_or_exits", use_processes=True, max_workers=1, log=log.append) as runner:
        died, *rest = _score_all(runner, samples, sequential=True)
    assert died.reward == 0.0 and died.reward_error.startswith("BrokenProcessPool")
    assert [s.reward for s in rest] == [1.0, 1.0, 1.0] and all(s.reward_error is None for s in rest)
    assert runner.stats.pools_broken == 2 and len(log) == 2  # it broke the pool, and the one it ran again in


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_reward_that_exits_or_interrupts_is_its_samples_error_not_the_runs_end(mode):
    """sys.exit() (0 included) and KeyboardInterrupt in a reward used to end seer-run."""
    samples = [_sample(t, i=i) for i, t in enumerate(["exit0", "exit3", "interrupt", "4"])]
    with RewardRunner(f"{MOD}:dies_or_exits", use_processes=mode == "process", max_workers=2) as runner:
        done = _score_all(runner, samples)
    assert [s.reward_error for s in done] == ["SystemExit: 0", "SystemExit: 3", "KeyboardInterrupt: ", None]
    assert [s.reward for s in done] == [0.0, 0.0, 0.0, 1.0]
    assert runner.stats.errors == 3 and runner.stats.pools_broken == 0


def test_cancelling_the_run_still_cancels_a_reward():
    """The one exception not taken as the sample's error: the run's own cancellation."""
    async def go():
        with RewardRunner(f"{MOD}:hang", timeout_s=60) as runner:
            task = runner.submit(_sample("4"))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return runner.stats

    assert asyncio.run(go()).errors == 0
