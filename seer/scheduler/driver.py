"""The async rollout driver: runs a policy against live instances until every request is done.

It owns only the concurrency: chunks in flight as tasks, telemetry polled in the background,
callbacks. Every decision and every piece of bookkeeping is the synchronous Dispatcher's, so a
simulator that implements InstanceBackend (or drives the Dispatcher on virtual time, as seer.sim does) measures
exactly what runs for real.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from seer.types import InstanceBackend, Telemetry
from seer.types import GenerateRequest, PromptSpec, Sample, SamplingParams
from seer.scheduler.config import SchedulerConfig
from seer.scheduler.decisions import Wait
from seer.scheduler.dispatcher import ChunkTicket, Dispatcher, RolloutError, Unfinished
from seer.scheduler.events import ChunkEvent, EnvWait, Progress
from seer.scheduler.policies import LengthKey
from seer.scheduler.routing import RoutingIncomplete
from seer.scheduler.turns import TurnEnd, TurnReply, TurnSplitter

SampleCallback = Callable[[Sample], Awaitable[None] | None]
StopCallback = Callable[[Sequence[Sample]], bool]
TurnCallback = Callable[[TurnEnd], Awaitable[TurnReply]]
ProgressCallback = Callable[[Progress], None]

log = logging.getLogger(__name__)


@dataclass
class RolloutResult:
    """Everything one iteration's rollout produced, raw; stats are derived from it."""

    policy: str
    samples: list[Sample]  # one per request, ordered by (group_id, sample_index)
    chunks: list[ChunkEvent]
    telemetry: list[Telemetry]  # sampled per instance over the run
    start_time: float  # driver clock
    end_time: float
    policy_summary: dict = field(default_factory=dict)
    dropped: list[tuple[str, str, float]] = field(default_factory=list)  # (instance, why, when): lost mid-run
    # A partial rollout (`stop_when`): the requests it stopped before they finished, as they were
    unfinished: list[Unfinished] = field(default_factory=list)
    env_waits: list[EnvWait] = field(default_factory=list)  # multi-turn: every wait for an environment
    routing: dict = field(default_factory=dict)  # routing replay's counters (seer.scheduler.routing); {} when off

    @property
    def wall_s(self) -> float:
        return self.end_time - self.start_time

    @property
    def output_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    def chunk_summary(self) -> dict:
        """The per-iteration counters issue 4 asks for (chunks, migrations, prefix reuse, probes)."""
        ok = [c for c in self.chunks if c.finish_reason != "error"]
        moved = [c for c in ok if c.migrated]
        probe_ends = [c.complete_time for c in ok if c.reason == "probe" and c.request_finished]
        return {
            "chunks_dispatched": len(self.chunks),
            "chunks_failed": len(self.chunks) - len(ok),
            "chunks_migrated": len(moved),
            "prefix_tokens_cached": sum(c.cached_prefix_tokens for c in ok),
            "prefix_tokens_recomputed": sum(c.recomputed_prefix_tokens for c in ok),
            "migrated_prefix_tokens_cached": sum(c.cached_prefix_tokens for c in moved),
            "migrated_prefix_tokens": sum(c.prompt_tokens for c in moved),
            "probe_phase_s": (max(probe_ends) - self.start_time) if probe_ends else None,
        }

    def preemptions(self) -> dict[str, int]:
        """Preemptions per instance during the run, from the first and last telemetry samples."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for t in self.telemetry:
            first.setdefault(t.instance, t.preemptions_total)
            last[t.instance] = t.preemptions_total
        return {name: last[name] - first[name] for name in first}


class RolloutDriver:
    """Runs iterations of rollout over a fixed set of instances.

    Usage (one call per iteration; the policy is rebuilt each time, it holds per-iteration state):

        driver = RolloutDriver(backends, SchedulerConfig(policy="context"))
        result = await driver.run(prompts, group_size=8, sampling=SamplingParams(max_tokens=..., seed=...),
                                  weight_version=i, request_id_prefix=f"it{i}-",
                                  on_sample_finished=reward_queue.put_nowait)
    """

    def __init__(
        self,
        backends: Sequence[InstanceBackend],
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        telemetry_timeout_s: float = 5.0,
    ) -> None:
        if not backends:
            raise ValueError("need at least one instance")
        self.backends = {b.name: b for b in backends}
        if len(self.backends) != len(backends):
            raise ValueError("instance names must be distinct")
        self.config = config or SchedulerConfig()
        self.clock = clock
        self.telemetry_timeout_s = telemetry_timeout_s
        self._heard: dict[str, float] = {}  # instance -> last telemetry or finished chunk (this run)

    async def run(
        self,
        prompts: Sequence[PromptSpec],
        *,
        group_size: int,
        sampling: SamplingParams,
        weight_version: int = 0,
        request_id_prefix: str = "",
        true_lengths: Mapping[LengthKey, int] | None = None,
        on_sample_finished: SampleCallback | None = None,
        on_progress: ProgressCallback | None = None,
        turns: TurnSplitter | None = None,
        on_turn_end: TurnCallback | None = None,
        stop_when: StopCallback | None = None,
    ) -> RolloutResult:
        """Generate `group_size` samples of every prompt; returns when all are finished.

        `on_sample_finished` is called as each sample finishes (rewards can start at once); if it
        returns an awaitable, that runs as a task and is awaited before run returns.
        `true_lengths` is for the oracle_lfs benchmark policy only.

        Multi-turn (`turns` and `on_turn_end` together): before a request's first turn and after
        each turn, `on_turn_end` runs as a task (the environment's work) while the request holds
        no instance slot and other chunks go on; its TurnReply continues or finishes the request.
        It must not raise: an environment's errors are its replies.

        `stop_when` is for rollouts that over-issue and keep only part: partial rollout (APRIL keeps
        the first that finish), dynamic sampling (issue more groups than the batch needs, stop once
        enough groups have rewards that differ). Called with the samples finished so far after each
        one finishes and after every wake-up of the loop (a chunk done, or the telemetry interval:
        rewards land between samples), so also with no new sample or none yet: it reads the whole
        list, not its last entry. Once it returns True the rollout ends there, chunks in flight are aborted and
        environment calls cancelled, and the requests left are returned in `RolloutResult.unfinished`.
        The single-turn rollout passes one under rollout.dynamic_sampling (seer.rollout.dynamic); a
        custom rollout function may (seer.rollout.base).
        """
        if (turns is None) != (on_turn_end is None):
            raise ValueError("multi-turn rollout needs both turns and on_turn_end")
        policy = self.config.build_policy(true_lengths)
        disp = Dispatcher(
            prompts,
            group_size,
            sampling,
            policy,
            list(self.backends),
            weight_version=weight_version,
            request_id_prefix=request_id_prefix,
            kv_capacity_tokens=self.config.kv_capacity_tokens,
            max_chunk_retries=self.config.max_chunk_retries,
            turns=turns,
            # routing replay: instances whose capture is on (seer.fleet.client.InstanceClient.enable_routing)
            routing=any(getattr(b, "routing", None) for b in self.backends.values()),
        )
        timeline: list[Telemetry] = []
        await self._poll_telemetry(disp, timeline)  # capacities before the first decision
        unbounded = [l.name for l in disp.loads if l.capacity_tokens <= 0]
        if policy.chunk_size is not None and unbounded and self.config.max_running is None:
            log.warning(
                "KV capacity unknown for %s and no scheduler.max_running: admission is unbounded there, "
                "so %s cannot order work; set scheduler.kv_capacity_tokens", unbounded, policy.name
            )
        start = self.clock()
        self._heard = {name: start for name in self.backends}  # last sign of life per instance
        pending: dict[asyncio.Task, ChunkTicket] = {}
        env_tasks: dict[asyncio.Task, TurnEnd] = {}
        env_started: dict[asyncio.Task, float] = {}
        env_waits: list[EnvWait] = []
        callbacks: list[asyncio.Task] = []

        stopped = False
        routing: dict = {}

        def finished(sample: Sample | None) -> None:
            nonlocal stopped
            if sample is None:
                return
            if on_sample_finished is not None:
                out = on_sample_finished(sample)
                if inspect.isawaitable(out):
                    callbacks.append(asyncio.ensure_future(out))
            if stop_when is not None and not stopped:
                stopped = stop_when(disp.samples)

        def poll_stop() -> None:
            """`stop_when` again after every wake-up: what it reads (a sample's reward, scored
            beside the rollout) may change between samples finishing."""
            nonlocal stopped
            if stop_when is not None and not stopped:
                stopped = stop_when(disp.samples)

        poller = asyncio.create_task(self._telemetry_loop(disp, timeline))
        try:
            while not disp.done and not stopped:
                for turn_end in disp.take_turn_ends():
                    env_task = asyncio.ensure_future(on_turn_end(turn_end))
                    env_tasks[env_task], env_started[env_task] = turn_end, self.clock()
                while True:
                    decision = disp.next_decision()
                    if isinstance(decision, Wait):
                        break
                    ticket = disp.start(decision, self.clock())
                    task = asyncio.create_task(self.backends[ticket.instance].generate(ticket.generate))
                    pending[task] = ticket
                if not pending and not env_tasks:
                    raise RolloutError(f"{len(disp.buffer) - disp.buffer.num_finished} requests left but nothing dispatchable")
                done, _ = await asyncio.wait(
                    [*pending, *env_tasks], timeout=self.config.telemetry_interval_s,
                    return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    self._drop_hung(disp, pending)
                    poll_stop()
                    continue
                # Once `stop_when` said stop, the rollout ends at that sample: what else finished in
                # the same wake-up stays in flight (aborted below, returned as unfinished).
                for task in sorted((t for t in done if t in env_tasks), key=lambda t: env_tasks[t].request.seq):
                    if stopped:
                        break
                    turn_end, now = env_tasks.pop(task), self.clock()
                    r = turn_end.request
                    env_waits.append(EnvWait(r.request_id, r.group_id, r.sample_index, turn_end.turn, r.last_instance,
                                             env_started.pop(task), now))
                    finished(disp.resume(turn_end, task.result(), now))
                done = {t for t in done if t in pending}
                # Completion order within one wakeup is arbitrary; fix it so decisions are reproducible.
                for task in sorted(done, key=lambda t: pending[t].request.seq):
                    if stopped:
                        break
                    ticket = pending.pop(task)
                    now = self.clock()
                    if task.cancelled() or task.exception() is not None:
                        error = None if task.cancelled() else task.exception()
                        lost = await self._instance_lost(disp, ticket.instance, error)
                        disp.fail(ticket, error, self.clock(), instance_lost=lost)
                        continue
                    self._heard[ticket.instance] = now
                    finished(disp.complete(ticket, task.result(), now))
                poll_stop()
                if on_progress is not None:
                    on_progress(
                        Progress(disp.buffer.num_finished, len(disp.buffer), len(pending),
                                 disp.output_tokens, self.clock() - start,
                                 queued=len(disp.buffer) - disp.buffer.num_finished - disp.buffer.num_running,
                                 migrated=disp.chunks_migrated,
                                 instances=tuple((l.name, l.kv_usage, l.running) for l in disp.loads))
                    )
            routing = await self._complete_routing(disp)
            end = self.clock()
            if callbacks:
                await asyncio.gather(*callbacks)
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            await self._abort(pending)
            for t in env_tasks:
                t.cancel()
            for cb in callbacks:
                cb.cancel()
        await self._poll_telemetry(disp, timeline)  # closing sample: preemption deltas cover the run
        return RolloutResult(
            policy=policy.name,
            samples=sorted(disp.samples, key=lambda s: (s.group_id, s.sample_index)),
            chunks=list(disp.events),
            telemetry=timeline,
            start_time=start,
            end_time=end,
            policy_summary=policy.summary(),
            dropped=list(disp.dropped),
            unfinished=disp.unfinished(),
            env_waits=env_waits,
            routing=routing,
        )

    async def _complete_routing(self, disp: Dispatcher) -> dict:
        """Routing replay: give every finished sample its routing (seer.scheduler.routing). Tokens
        no returned chunk computed are recomputed first, on a live instance, with a cache salt so
        that it computes them all; a sample whose routing stays incomplete fails the rollout."""
        ledger = disp.routing
        if ledger is None:
            return {}
        t0 = self.clock()
        tokens = {s.request_id: [*s.prompt.prompt_ids, *s.response_ids] for s in disp.samples}
        todo = [(rid, n) for rid, toks in tokens.items() if (n := ledger.missing_prefix(rid, toks))]

        async def recompute(k: int, rid: str, n: int) -> None:
            live = [l.name for l in disp.loads if l.down is None and getattr(self.backends[l.name], "routing", None)]
            errors = []
            for name in live[k % len(live):] + live[: k % len(live)] if live else []:
                req = GenerateRequest(f"{rid}-routing", tokens[rid][:n], 1, SamplingParams(max_tokens=1),
                                      logprobs=False, cache_salt=secrets.token_hex(8))
                try:
                    result = await self.backends[name].generate(req)
                except Exception as e:  # that instance failed: try the next
                    errors.append(f"{name}: {e!r}")
                    continue
                if result.routing is None or result.routing_start != 0:
                    errors.append(f"{name}: no routing from position 0 (start {result.routing_start})")
                    continue
                ledger.add_recomputed(rid, result, n)
                return
            raise RoutingIncomplete(f"{rid}: the routing of its first {n} tokens is missing and could not be "
                                    f"recomputed: {'; '.join(errors) or 'no live instance captures routing'}")

        await asyncio.gather(*(recompute(k, rid, n) for k, (rid, n) in enumerate(todo)))
        for s in disp.samples:
            s.routing = ledger.routing_of(s.request_id, tokens[s.request_id])
        summary = ledger.summary()
        summary.update(recomputed_tokens=sum(n for _, n in todo), complete_s=round(self.clock() - t0, 4))
        return summary

    async def _instance_lost(self, disp: Dispatcher, name: str, error: BaseException | None) -> bool:
        """After a chunk failed: is its instance gone? A down instance stays down for the rollout;
        one that still answers its telemetry endpoint is alive and the chunk simply failed."""
        if disp.load(name).down is not None:
            return True
        probe: Exception | None = None
        for attempt in range(2):  # a second probe on a fresh connection: one reset is not a death
            try:
                await asyncio.wait_for(self.backends[name].telemetry(), self.telemetry_timeout_s)
                return False
            except Exception as e:
                probe = e
                if attempt == 0:
                    await asyncio.sleep(0.2)
        self._mark_down(disp, name, f"dead: chunk failed with {error!r}; health probe: {probe!r}")
        return True

    def _mark_down(self, disp: Dispatcher, name: str, why: str) -> None:
        if disp.mark_down(name, why, self.clock()):
            log.warning("instance %s dropped from the rollout (%s); its chunks continue elsewhere", name, why)

    def _drop_hung(self, disp: Dispatcher, pending: dict[asyncio.Task, ChunkTicket]) -> None:
        """Drop instances with chunks in flight that have shown no sign of life for
        ``instance_timeout_s``; cancelling their chunks sends them back to the buffer."""
        now = self.clock()
        for load in disp.loads:
            if load.down is not None or load.running == 0:
                continue
            silent = now - self._heard[load.name]
            if silent <= self.config.instance_timeout_s:
                continue
            self._mark_down(disp, load.name, f"hung: no telemetry and no finished chunk for {silent:.0f} s")
            for task, ticket in pending.items():
                if ticket.instance == load.name:
                    task.cancel()

    async def _poll_telemetry(self, disp: Dispatcher, timeline: list[Telemetry]) -> None:
        """One telemetry sample of every instance; an instance that does not answer keeps its last."""
        results = await asyncio.gather(
            *(asyncio.wait_for(b.telemetry(), self.telemetry_timeout_s) for b in self.backends.values()),
            return_exceptions=True,
        )
        for t in results:
            if isinstance(t, Telemetry):
                disp.observe(t)
                timeline.append(t)
                if t.instance in self._heard:
                    self._heard[t.instance] = self.clock()

    async def _telemetry_loop(self, disp: Dispatcher, timeline: list[Telemetry]) -> None:
        while True:
            await asyncio.sleep(self.config.telemetry_interval_s)
            await self._poll_telemetry(disp, timeline)

    async def _abort(self, pending: dict[asyncio.Task, ChunkTicket]) -> None:
        """On error or cancellation, stop chunks still running so instances do not keep generating."""
        if not pending:
            return
        for task in pending:
            task.cancel()
        await asyncio.gather(
            *(self.backends[t.instance].abort(t.generate.request_id) for t in pending.values()),
            *pending,
            return_exceptions=True,
        )
        pending.clear()
