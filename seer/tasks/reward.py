"""Reward functions, named by `module:function`, and the runner that scores samples asynchronously.

Rewards run beside generation, as in the paper: the rollout hands each finished sample to
the runner and keeps generating; the scores arrive on worker threads (or processes, for
CPU-heavy rewards that should not hold the GIL). A reward function that raises (anything:
SystemExit and KeyboardInterrupt too), returns junk, runs past the per-sample timeout or kills its
worker process marks its sample with `reward_error` and then either scores 0 or aborts the
iteration, by policy; it never ends the run.

The run config's settings: `rollout.reward_workers` (concurrent calls), `rollout.reward_mode`
(thread | process), `rollout.reward_timeout_s` (per sample; default BOUNDS.reward_s; None: no
limit) and `rollout.reward_error_policy` (zero | abort).
"""

from __future__ import annotations

import asyncio
import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from seer.plugins import PluginError, resolve
from seer.tasks.workers import BOUNDS, Workers, run_cancelled
from seer.types import Sample

RewardFn = Callable[[str, dict], float]  # fn(response_text, reference) -> reward
OnError = Literal["zero", "abort"]


class RewardSpecError(PluginError):
    """A `module:function` reward spec that does not name a callable."""


class RewardAborted(RuntimeError):
    """A sample could not be scored (its reward function raised, or the system failed it: Sample.failure)
    and the policy (rollout.reward_error_policy: abort) is to abort the iteration."""

    def __init__(self, sample: Sample, what: str = "reward failed"):
        super().__init__(f"{what} for request {sample.request_id} (prompt {sample.prompt.index}): {sample.reward_error}"
                         " (rollout.reward_error_policy: abort)")
        self.sample = sample


def resolve_reward_fn(spec: str) -> RewardFn:
    """Import `module:function` (`task.reward`); every failure says which part of the spec is wrong."""
    return resolve(spec, key="task.reward", error=RewardSpecError)


def as_reward(value: object, what: str = "reward function") -> float:
    """A user program's reward as a float, or TypeError naming `what` and the value.

    Any real number is a reward: Python's int and float, NumPy's scalars (np.float32, np.int64),
    Fraction, Decimal, a 0-d array or tensor (anything not complex that float() takes, strings aside).
    Refused: bool (True from a predicate is not a score; return 1.0), an array with a shape, NaN and
    infinities, and a number too large for a float (10**400), which would otherwise raise
    OverflowError in the driver. Rewards, environments' rewards and agents' returns all pass here."""
    is_bool = isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")
    real = isinstance(value, numbers.Real) or (not isinstance(value, (numbers.Complex, str, bytes, bytearray))
                                              and getattr(getattr(value, "dtype", None), "kind", None) != "c"
                                              and hasattr(type(value), "__float__"))
    if is_bool or not real or getattr(value, "ndim", 0) != 0:
        raise TypeError(f"{what} returned {_shown(value)} ({type(value).__name__}); expected a finite real number "
                        "(bool is refused: return 1.0 or 0.0)")
    try:
        out = float(value)  # type: ignore[arg-type]
    except OverflowError:
        raise TypeError(f"{what} returned {_shown(value)}: too large for a float; expected a finite real number") from None
    except Exception as e:  # noqa: BLE001 - a stranger's __float__ may raise anything
        raise TypeError(f"{what} returned {_shown(value)}, which is not a float: {e}") from None
    if not math.isfinite(out):
        raise TypeError(f"{what} returned {_shown(value)}; expected a finite real number")
    return out


def _shown(value: object, limit: int = 80) -> str:
    """A value in an error text, bounded (10**400 has 401 digits)."""
    try:
        text = repr(value)
    except Exception:  # a stranger's __repr__ may raise too
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def call_reward(fn: RewardFn, response_text: str, reference: dict) -> float:
    """Call and validate: a reward must be a finite real number (as_reward)."""
    return as_reward(fn(response_text, reference))


_worker_fns: dict[str, RewardFn] = {}


def _call_by_spec(spec: str, response_text: str, reference: dict) -> float:
    """Runs in a worker process: resolve once per process, then call."""
    fn = _worker_fns.get(spec)
    if fn is None:
        fn = _worker_fns[spec] = resolve_reward_fn(spec)
    return call_reward(fn, response_text, reference)


def _warm_worker(spec: str) -> None:
    """Runs once per fresh worker process: the import is start-up, not the first sample's time."""
    if spec not in _worker_fns:
        _worker_fns[spec] = resolve_reward_fn(spec)


@dataclass
class RewardStats:
    scored: int = 0
    errors: int = 0  # samples whose reward function raised, returned junk or timed out
    busy_s: float = 0.0  # summed wall time of reward calls
    pools_broken: int = 0  # process pools replaced because a reward's worker process died


class RewardRunner:
    """Scores samples off the event loop; `submit` per finished sample, `wait_all` at the end.

    `reward` is a `module:function` spec or a callable (callables need threads: processes
    receive the spec and import it themselves). `decode` fills `response_text` from
    `response_ids` for samples that arrive without text.

    At most `max_workers` calls run at once. `timeout_s` bounds each call's own run time (not
    its wait for a worker): a call past it scores as an error and no longer holds a worker. A
    thread cannot be stopped, so a timed-out thread call runs on, detached, until it returns;
    a timed-out process call has its worker process killed (the pool is replaced, and calls
    that were running in it start again in the new one). Neither holds up the rollout or close().
    A worker process that dies (segfault, os._exit) has its pool replaced the same way, counted in
    `stats.pools_broken` and told to `log` (the run's run.log).
    """

    def __init__(
        self,
        reward: str | RewardFn,
        *,
        max_workers: int = 2,
        on_error: OnError = "zero",
        use_processes: bool = False,
        timeout_s: float | None = BOUNDS.reward_s,
        decode: Callable[[list[int]], str] | None = None,
        log: Callable[[str], None] | None = None,
    ):
        if on_error not in ("zero", "abort"):
            raise ValueError(f"on_error must be 'zero' or 'abort', not {on_error!r}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self._spec = reward if isinstance(reward, str) else None
        self._fn = resolve_reward_fn(reward) if isinstance(reward, str) else reward
        if use_processes and self._spec is None:
            raise ValueError("a process pool needs the reward as a 'module:function' spec")
        self.max_workers = max_workers
        self._processes = use_processes
        self._workers = Workers(max_workers, use_processes=use_processes, timeout_s=timeout_s,
                                warm=_warm_worker if use_processes else None, warm_args=(self._spec,),
                                name="reward workers", log=log)
        self.on_error = on_error
        self.timeout_s = timeout_s
        self._decode = decode
        self._pending: list[asyncio.Task[Sample]] = []
        self.stats = RewardStats()

    async def score(self, sample: Sample) -> Sample:
        """Set sample.reward (and reward_error on failure); raise RewardAborted under 'abort'."""
        if not sample.response_text and sample.response_ids and self._decode is not None:
            sample.response_text = self._decode(sample.response_ids)
        text, ref = sample.response_text, sample.prompt.reference
        try:
            async with self._workers.slots():
                t0 = time.monotonic()
                try:
                    if self._processes:
                        sample.reward = await self._workers.run(_call_by_spec, self._spec, text, ref)
                    else:
                        sample.reward = await self._workers.run(call_reward, self._fn, text, ref)
                    sample.reward_error = None
                finally:
                    self.stats.busy_s += time.monotonic() - t0
        except asyncio.TimeoutError:
            self._fail(sample, f"TimeoutError: reward took longer than {self.timeout_s} s")
        except BaseException as e:  # the user's function may raise anything, SystemExit included
            if run_cancelled(e):
                raise
            self._fail(sample, f"{type(e).__name__}: {e}")
        finally:
            self.stats.scored += 1
            self.stats.pools_broken = self._workers.pools_broken
        if sample.reward_error is not None and self.on_error == "abort":
            raise RewardAborted(sample)
        return sample

    def _fail(self, sample: Sample, error: str) -> None:
        sample.reward, sample.reward_error, sample.failure = 0.0, error, "reward"
        self.stats.errors += 1

    def submit(self, sample: Sample) -> asyncio.Task[Sample]:
        """Start scoring now (call from the event loop); the rollout does not wait for it."""
        task = asyncio.get_running_loop().create_task(self.score(sample))
        self._pending.append(task)
        return task

    async def wait_all(self) -> list[Sample]:
        """Every submitted sample, scored, in submission order; raises RewardAborted on the first abort."""
        pending, self._pending = self._pending, []
        try:
            return list(await asyncio.gather(*pending))
        except RewardAborted:
            for t in pending:
                t.cancel()
            raise

    def close(self) -> None:
        """Stop the workers. Nothing is waited for: call after wait_all (a call still running, as
        after an abort, is given up: its process is killed, its thread left to finish detached)."""
        self._workers.close()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
