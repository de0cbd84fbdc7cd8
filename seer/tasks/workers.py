"""Calls off the event loop with a per-call timeout: the one runner behind rewards and environment steps.

User code (a reward function, an environment's tool call) may block, hog the GIL or hang; the
rollout must not. A call runs on its own daemon thread (a timed-out thread cannot be stopped: it
runs on, detached) or in a spawned worker process (a timed-out call has its worker killed: the
pool is replaced, and calls that were running in it start again in the new one). Neither holds
up the rollout or close().
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any


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
                 warm: Callable[..., Any] | None = None, warm_args: tuple = ()) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self.use_processes = use_processes
        self._warm_fn, self._warm_args = warm, warm_args
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

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in a worker within the timeout; the caller holds a slot (`slots()`)."""
        return await (self._in_process(fn, args) if self.use_processes else self._in_thread(fn, args))

    async def _in_thread(self, fn: Callable[..., Any], args: tuple) -> Any:
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
        return await asyncio.wait_for(fut, self.timeout_s)

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        pool = concurrent.futures.ProcessPoolExecutor(self.max_workers, mp_context=multiprocessing.get_context("spawn"))
        self._warm = ([pool.submit(self._warm_fn, *self._warm_args) for _ in range(self.max_workers)]
                      if self._warm_fn is not None else [])
        return pool

    async def _in_process(self, fn: Callable[..., Any], args: tuple) -> Any:
        retried = False
        while True:
            pool, warm = self._pool, self._warm
            try:
                await asyncio.gather(*map(asyncio.wrap_future, warm))  # the workers' start is not the call's time
                if pool is not self._pool:
                    continue  # replaced (another call timed out) while it started
                fut = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
                return await asyncio.wait_for(fut, self.timeout_s)
            except asyncio.TimeoutError:
                self._replace_pool(pool)  # its worker is stuck in the call: kill it
                raise
            except BrokenProcessPool:
                if pool is not self._pool and not retried:  # killed for another call's timeout: run again
                    retried = True
                    continue
                raise

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
