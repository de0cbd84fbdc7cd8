"""Reward functions, named by `module:function`, and the runner that scores samples asynchronously.

Rewards run beside generation, as in the paper: the rollout hands each finished sample to
the runner and keeps generating; the scores arrive on worker threads (or processes, for
CPU-heavy rewards that should not hold the GIL). A reward function that raises marks its
sample with `reward_error` and then either scores 0 or aborts the iteration, by policy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from seer.plugins import PluginError, resolve
from seer.types import Sample

RewardFn = Callable[[str, dict], float]  # fn(response_text, reference) -> reward
OnError = Literal["zero", "abort"]


class RewardSpecError(PluginError):
    """A `module:function` reward spec that does not name a callable."""


class RewardAborted(RuntimeError):
    """A reward function raised and the policy is to abort the iteration."""

    def __init__(self, sample: Sample):
        super().__init__(f"reward failed for request {sample.request_id} (prompt {sample.prompt.index}): {sample.reward_error}")
        self.sample = sample


def resolve_reward_fn(spec: str) -> RewardFn:
    """Import `module:function` (`task.reward`); every failure says which part of the spec is wrong."""
    return resolve(spec, key="task.reward", error=RewardSpecError)


def call_reward(fn: RewardFn, response_text: str, reference: dict) -> float:
    """Call and validate: a reward must be a finite number."""
    value = fn(response_text, reference)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"reward function returned {value!r}; expected a finite float")
    return float(value)


_worker_fns: dict[str, RewardFn] = {}


def _call_by_spec(spec: str, response_text: str, reference: dict) -> float:
    """Runs in a worker process: resolve once per process, then call."""
    fn = _worker_fns.get(spec)
    if fn is None:
        fn = _worker_fns[spec] = resolve_reward_fn(spec)
    return call_reward(fn, response_text, reference)


@dataclass
class RewardStats:
    scored: int = 0
    errors: int = 0  # samples whose reward function raised, returned junk or timed out
    busy_s: float = 0.0  # summed wall time of reward calls


class RewardRunner:
    """Scores samples off the event loop; `submit` per finished sample, `wait_all` at the end.

    `reward` is a `module:function` spec or a callable (callables need threads: processes
    receive the spec and import it themselves). `decode` fills `response_text` from
    `response_ids` for samples that arrive without text.
    """

    def __init__(
        self,
        reward: str | RewardFn,
        *,
        max_workers: int = 2,
        on_error: OnError = "zero",
        use_processes: bool = False,
        timeout_s: float | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ):
        if on_error not in ("zero", "abort"):
            raise ValueError(f"on_error must be 'zero' or 'abort', not {on_error!r}")
        self._spec = reward if isinstance(reward, str) else None
        self._fn = resolve_reward_fn(reward) if isinstance(reward, str) else reward
        if use_processes and self._spec is None:
            raise ValueError("a process pool needs the reward as a 'module:function' spec")
        self._processes = use_processes
        self._executor: concurrent.futures.Executor = (
            concurrent.futures.ProcessPoolExecutor(max_workers, mp_context=multiprocessing.get_context("spawn"))
            if use_processes
            else concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="seer-reward")
        )
        self.on_error = on_error
        self.timeout_s = timeout_s
        self._decode = decode
        self._pending: list[asyncio.Task[Sample]] = []
        self.stats = RewardStats()

    async def score(self, sample: Sample) -> Sample:
        """Set sample.reward (and reward_error on failure); raise RewardAborted under 'abort'."""
        if not sample.response_text and sample.response_ids and self._decode is not None:
            sample.response_text = self._decode(sample.response_ids)
        loop = asyncio.get_running_loop()
        if self._processes:
            call = loop.run_in_executor(self._executor, _call_by_spec, self._spec, sample.response_text, sample.prompt.reference)
        else:
            call = loop.run_in_executor(self._executor, call_reward, self._fn, sample.response_text, sample.prompt.reference)
        t0 = time.monotonic()
        try:
            sample.reward = await asyncio.wait_for(call, self.timeout_s)
            sample.reward_error = None
        except asyncio.TimeoutError:
            self._fail(sample, f"TimeoutError: reward took longer than {self.timeout_s} s")
        except Exception as e:  # the user's function may raise anything
            self._fail(sample, f"{type(e).__name__}: {e}")
        finally:
            self.stats.scored += 1
            self.stats.busy_s += time.monotonic() - t0
        if sample.reward_error is not None and self.on_error == "abort":
            raise RewardAborted(sample)
        return sample

    def _fail(self, sample: Sample, error: str) -> None:
        sample.reward, sample.reward_error = 0.0, error
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
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
