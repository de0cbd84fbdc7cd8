"""Calls off the event loop with a per-call timeout: the one runner behind rewards and environment steps.

User code (a reward function, an environment's tool call) may block, hog the GIL or hang; the
rollout must not. A call runs on its own daemon thread (a timed-out thread cannot be stopped: it
runs on, detached) or in a spawned worker process (a timed-out call has its worker killed: the
pool is replaced, and calls that were running in it start again in the new one). A worker process
that dies on its own (a segfault, os._exit, the OOM killer) breaks its pool: that pool is replaced
too, counted and reported, and its calls run once again in the new one. Neither holds up the
rollout or close().
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import EllipsisType
from typing import Any


@dataclass(frozen=True)
class UserCodeBounds:
    """The default bound, in seconds, on each kind of call into user code: generous (a reward or a
    tool may be slow), but never none, so that a hung call costs its sample, not the run. The
    settings default to these (null in a config lifts a bound)."""

    reward_s: float = 300.0  # rollout.reward_timeout_s: one reward call
    env_call_s: float = 10.0  # env.timeout_s: an environment's reset, step or error_observation
    env_init_s: float = 60.0  # env.init_timeout_s: an environment's constructor


BOUNDS = UserCodeBounds()


def run_cancelled(e: BaseException) -> bool:
    """`e` is the cancellation of the run's own task (to pass on), not something user code raised:
    a call's KeyboardInterrupt, SystemExit or even CancelledError is only that call's error."""
    task = asyncio.current_task()
    return isinstance(e, asyncio.CancelledError) and task is not None and task.cancelling() > 0


def _settle(fut: asyncio.Future, ok: bool, value) -> None:
    if not fut.done():  # not given up on (timed out, cancelled) meanwhile
        fut.set_result(value) if ok else fut.set_exception(value)


class Workers:
    """At most `max_workers` calls at once, each bounded by `timeout_s` of its own run time (not
    its wait for a worker); past it the call raises asyncio.TimeoutError and no longer holds a worker.

    With `use_processes`, `fn` and its arguments must pickle (module-level functions), and
    `warm` (a picklable function) runs once in every fresh worker so that imports are start-up,
    not the first call's time.
    """

    def __init__(self, max_workers: int, *, use_processes: bool = False, timeout_s: float | None = None,
                 warm: Callable[..., Any] | None = None, warm_args: tuple = (), name: str = "worker",
                 log: Callable[[str], None] | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self.use_processes = use_processes
        self._warm_fn, self._warm_args = warm, warm_args
        self.name, self._log = name, log
        self.pools_broken = 0  # process pools replaced because a worker died on its own
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._warm: list[concurrent.futures.Future] = []
        if use_processes:
            self._pool = self._new_pool()
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def slots(self) -> asyncio.Semaphore:
        """The worker slots, one set per event loop (the loop runs an asyncio.run per iteration)."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_workers))
        return self._slots[1]

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in a worker, within the slots and the timeout."""
        async with self.slots():
            return await self.run(fn, *args)

    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None | EllipsisType = ...) -> Any:
        """`fn(*args)` in a worker within the timeout (`timeout_s`: another one for this call); the
        caller holds a slot (`slots()`)."""
        timeout = self.timeout_s if timeout_s is ... else timeout_s
        return await (self._in_process(fn, args, timeout) if self.use_processes else self._in_thread(fn, args, timeout))

    async def _in_thread(self, fn: Callable[..., Any], args: tuple, timeout: float | None) -> Any:
        """One call on its own daemon thread, so that one past its timeout can be left behind."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def target() -> None:
            try:
                outcome = (True, fn(*args))
            except BaseException as e:  # handed to the awaiting coroutine
                outcome = (False, e)
            try:
                loop.call_soon_threadsafe(_settle, fut, *outcome)
            except RuntimeError:  # the loop has closed: nobody waits for this any more
                pass

        threading.Thread(target=target, name="seer-worker", daemon=True).start()
        return await asyncio.wait_for(fut, timeout)

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        pool = concurrent.futures.ProcessPoolExecutor(self.max_workers, mp_context=multiprocessing.get_context("spawn"))
        self._warm = ([pool.submit(self._warm_fn, *self._warm_args) for _ in range(self.max_workers)]
                      if self._warm_fn is not None else [])
        return pool

    async def _in_process(self, fn: Callable[..., Any], args: tuple, timeout: float | None) -> Any:
        retried = False
        while True:
            pool, warm = self._pool, self._warm
            try:
                await asyncio.gather(*map(asyncio.wrap_future, warm))  # the workers' start is not the call's time
                if pool is not self._pool:
                    continue  # replaced (another call timed out) while it started
                fut = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
                return await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                self._replace_pool(pool)  # its worker is stuck in the call: kill it
                raise
            except BrokenProcessPool:
                if pool is self._pool:  # a worker died on its own (this call's or another's): a new pool
                    self.pools_broken += 1
                    if self._log is not None:
                        self._log(f"{self.name}: a worker process died (segfault, os._exit, out of memory?); "
                                  f"its pool is replaced ({self.pools_broken} so far) and its calls run once again")
                    self._replace_pool(pool)
                if retried:  # broken under it twice: give up on this call (it may be the one that kills)
                    raise
                retried = True

    def _replace_pool(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        if pool is self._pool:
            self._pool = self._new_pool()
            self._kill(pool)

    @staticmethod
    def _kill(pool: concurrent.futures.ProcessPoolExecutor) -> None:
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.kill()

    def close(self) -> None:
        """Stop the workers. Nothing is waited for: a call still running is given up (its process
        is killed, its thread left to finish detached)."""
        if self._pool is not None:
            self._kill(self._pool)
