"""The synchronous core of a rollout: buffer + policy + instance loads, advanced one event at a time.

The async driver wraps it around real instances; a discrete-event simulator can drive it
directly on virtual time. Either way the same bookkeeping and the same policy code run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from seer.types import Telemetry
from seer.types import GenerateRequest, GenerateResult, PromptSpec, Sample, SamplingParams
from seer.scheduler.config import DEFAULTS
from seer.scheduler.buffer import Request, RequestBuffer, RequestStatus
from seer.request_ids import chunk_id as make_chunk_id
from seer.scheduler.chunks import chunk_seed
from seer.scheduler.decisions import Decision, Dispatch
from seer.scheduler.events import ChunkEvent
from seer.scheduler.placement import InstanceLoad
from seer.scheduler.policies import Policy
from seer.scheduler.routing import RoutingLedger
from seer.scheduler.turns import TurnEnd, TurnReply, TurnSplitter


class RolloutError(RuntimeError):
    """The rollout cannot finish (a request keeps failing, or nothing can ever be dispatched)."""


@dataclass(frozen=True)
class ChunkTicket:
    """A chunk in flight: what was sent where, and what it reserved."""

    request: Request
    chunk_index: int
    instance: str
    reason: str
    max_tokens: int
    kv_tokens: int
    migrated: bool
    dispatch_time: float
    generate: GenerateRequest
    turn: int = 0  # multi-turn: turns the request had ended when this chunk was sent


@dataclass(frozen=True)
class Unfinished:
    """A request a partial rollout (`RolloutDriver.run(stop_when=...)`) stopped before it finished:
    the tokens of its completed chunks (a chunk in flight at the stop is aborted and its tokens are
    lost) and, multi-turn, its loss mask and whether it waited for its environment. An APRIL-style
    rollout carries it into the next iteration, whose prompt is its history."""

    request_id: str
    group_id: int
    sample_index: int
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...] | None  # multi-turn: 1 on the model's tokens
    turns: int  # multi-turn: model turns ended so far
    waiting_env: bool  # multi-turn: waiting for its environment's answer (or its first turn's start)
    instances: tuple[str, ...]  # one per completed chunk
    aborted: bool = False  # a chunk of it was in flight at the stop (aborted, its tokens lost)


class Dispatcher:
    def __init__(
        self,
        prompts: Sequence[PromptSpec],
        group_size: int,
        sampling: SamplingParams,
        policy: Policy,
        instances: Sequence[str],
        *,
        weight_version: int = 0,
        request_id_prefix: str = "",
        kv_capacity_tokens: int | None = None,
        max_chunk_retries: int = DEFAULTS.max_chunk_retries,
        turns: TurnSplitter | None = None,
        routing: bool = False,
    ) -> None:
        """`sampling.max_tokens` is each request's length limit; `sampling.seed`, when set, is the
        base of every chunk's seed. `kv_capacity_tokens` overrides what telemetry reports.

        `turns`: multi-turn requests. Every request then starts waiting for its environment, and
        each turn that ends (by `turns.cut`) is queued in `turn_ends` until `resume` answers it;
        `sampling.max_tokens` bounds the whole trajectory, observations included.

        `routing`: routing replay; each chunk's routing joins its request's (seer.scheduler.routing)."""
        if not instances or len(set(instances)) != len(instances):
            raise ValueError(f"need distinct instance names, got {list(instances)}")
        self.buffer = RequestBuffer(prompts, group_size, sampling.max_tokens, request_id_prefix,
                                    multi_turn=turns is not None)
        self.turns = turns
        # Multi-turn: requests whose environment must answer before they continue, oldest first.
        self.turn_ends: list[TurnEnd] = ([TurnEnd(r, 0, (), "start") for r in self.buffer.requests.values()]
                                         if turns is not None else [])
        self.sampling = sampling
        self.policy = policy
        self.weight_version = weight_version
        self.max_chunk_retries = max_chunk_retries
        self._capacity_override = kv_capacity_tokens
        self.loads = [
            InstanceLoad(name, i, capacity_tokens=kv_capacity_tokens or 0) for i, name in enumerate(instances)
        ]
        self._load_of = {load.name: load for load in self.loads}
        self.events: list[ChunkEvent] = []
        self.dropped: list[tuple[str, str, float]] = []  # (instance, why, when)
        self.samples: list[Sample] = []
        self.output_tokens = 0
        self.chunks_migrated = 0  # completed chunks that ran elsewhere than their request's previous one
        self.routing = RoutingLedger() if routing else None
        for req in self.buffer.ready():
            policy.on_ready(req)

    @property
    def done(self) -> bool:
        return self.buffer.done

    @property
    def running(self) -> int:
        return self.buffer.num_running

    def observe(self, t: Telemetry) -> None:
        """Fold an instance's telemetry into its load (capacity, block size, usage, preemptions)."""
        load = self._load_of.get(t.instance)
        if load is None:
            return
        if self._capacity_override is None and t.kv_capacity_tokens > 0:
            load.capacity_tokens = t.kv_capacity_tokens
        load.kv_usage = t.kv_usage
        if t.block_size > 0:
            load.block_size = t.block_size
        load.preemptions_total = t.preemptions_total

    def load(self, instance: str) -> InstanceLoad:
        return self._load_of[instance]

    def next_decision(self) -> Decision:
        return self.policy.pick(self.loads)

    def start(self, d: Dispatch, now: float) -> ChunkTicket:
        """Carry out a dispatch: book the KV, mark the request running, build the engine request."""
        req = d.request
        prev = req.last_instance
        prompt = req.next_prompt()  # before begin_chunk: the prompt is everything so far
        chunk_index = self.buffer.begin_chunk(req, d.instance, now)
        load = self._load_of[d.instance]
        load.reserved_tokens += d.kv_tokens
        load.running += 1
        self.policy.on_dispatched(d)
        # A retried chunk keeps its index (hence its seed) but needs a fresh id on the engine.
        chunk_id = make_chunk_id(req.request_id, chunk_index, req.failures)
        max_tokens = min(d.max_tokens, self._turn_tokens_left(req))
        sampling = replace(
            self.sampling,
            max_tokens=max_tokens,
            seed=chunk_seed(self.sampling.seed, req.request_id, chunk_index),
        )
        return ChunkTicket(
            request=req,
            chunk_index=chunk_index,
            instance=d.instance,
            reason=d.reason,
            max_tokens=max_tokens,
            kv_tokens=d.kv_tokens,
            migrated=prev is not None and prev != d.instance,
            dispatch_time=now,
            generate=GenerateRequest(chunk_id, prompt, max_tokens, sampling, priority=d.priority,
                                     stop=self.turns.stop_for(req.request_id) if self.turns is not None else ()),
            turn=self._turns_of(req),
        )

    def _release(self, ticket: ChunkTicket) -> None:
        load = self._load_of[ticket.instance]
        load.reserved_tokens -= ticket.kv_tokens
        load.running -= 1

    def complete(self, ticket: ChunkTicket, result: GenerateResult, now: float) -> Sample | None:
        """Feed a chunk's result back; returns the Sample when its request just finished.

        An aborted chunk keeps whatever tokens it produced (they are valid samples of the same
        weights) and counts as a failure, so an engine that aborts forever fails the rollout.
        """
        self._release(ticket)
        req = ticket.request
        if len(result.token_ids) > ticket.max_tokens:
            raise RolloutError(
                f"{result.request_id}: engine returned {len(result.token_ids)} tokens for max_tokens={ticket.max_tokens}"
            )
        if self.turns is not None:
            self._complete_turn_chunk(ticket, result, now)
            return None
        before = req.generated
        finished = self.buffer.end_chunk(req, result.token_ids, result.logprobs, result.finish_reason, now)
        self._record_routing(ticket, result, req.generated - before)
        self.output_tokens += len(result.token_ids)
        self.chunks_migrated += ticket.migrated
        self.events.append(self._event(
            ticket, now, cached_prefix_tokens=result.cached_prefix_tokens, new_tokens=len(result.token_ids),
            finish_reason=result.finish_reason, engine_start_time=result.start_time,
            engine_finish_time=result.finish_time, request_finished=finished,
        ))
        if finished:
            self.policy.on_finished(req)
            sample = self._sample(req)
            self.samples.append(sample)
            return sample
        if result.finish_reason == "abort":
            self._count_failure(req, f"aborted on {ticket.instance}")
        self.policy.on_ready(req)
        return None

    def _complete_turn_chunk(self, ticket: ChunkTicket, result: GenerateResult, now: float) -> None:
        """A multi-turn chunk: cut it where its turn ends; a turn that ended waits for its environment."""
        req = ticket.request
        ts = self.buffer.turn_state[req.request_id]
        cut = self.turns.cut(req.generated_ids[ts.turn_start:], result.token_ids, result.finish_reason,
                             req.request_id)
        keep, reason = (len(result.token_ids), None) if cut is None else (cut.keep, cut.reason)
        room = req.max_tokens - req.generated
        if keep >= room:  # the trajectory's budget is spent: this turn is its last
            keep, reason = room, "length"
        ids = list(result.token_ids[:keep])
        self.buffer.end_turn_chunk(req, ids, list(result.logprobs[:keep]), now, turn_over=reason is not None)
        self._record_routing(ticket, result, len(ids))
        self.output_tokens += len(ids)
        self.chunks_migrated += ticket.migrated
        self.events.append(self._event(
            ticket, now, cached_prefix_tokens=result.cached_prefix_tokens, new_tokens=len(ids),
            finish_reason=result.finish_reason, engine_start_time=result.start_time,
            engine_finish_time=result.finish_time, request_finished=False,
        ))
        if reason is not None:
            self.turn_ends.append(TurnEnd(req, ts.turns, tuple(req.generated_ids[ts.turn_start:]), reason))
            return
        if result.finish_reason == "abort":
            self._count_failure(req, f"aborted on {ticket.instance}")
        self.policy.on_ready(req)

    def _record_routing(self, ticket: ChunkTicket, result: GenerateResult, kept: int) -> None:
        if self.routing is not None:
            req = ticket.request
            self.routing.record(req.request_id, req.next_prompt(), len(ticket.generate.prompt_ids), kept, result)

    def _turn_tokens_left(self, req: Request) -> int:
        """Multi-turn with env.max_turn_tokens: what the request's turn may still generate, so that
        an engine never generates past the turn's end (tokens the turn's cut would throw away)."""
        ts = self.buffer.turn_state.get(req.request_id)
        limit = self.turns.turn_limit(req.request_id) if self.turns is not None else None
        if ts is None or limit is None:
            return 1 << 30
        return max(1, limit - (req.generated - ts.turn_start))

    def _turns_of(self, req: Request) -> int:
        ts = self.buffer.turn_state.get(req.request_id)
        return ts.turns if ts is not None else 0

    def take_turn_ends(self) -> list[TurnEnd]:
        """The turns that ended since the last call (multi-turn): each awaits one `resume`."""
        out, self.turn_ends = self.turn_ends, []
        return out

    def resume(self, end: TurnEnd, reply: TurnReply, now: float) -> Sample | None:
        """The environment's answer to `end`: the request continues after the observation, or is
        finished (returns its Sample). A request whose budget is spent cannot continue."""
        req = end.request
        if reply.rewind_to is not None:
            self.buffer.rewind(req, reply.rewind_to)
        if reply.done or end.reason == "length":
            self.buffer.finish(req, reply.finish_reason if reply.done else "length")
            req.last_finish = now
            self.policy.on_finished(req)
            sample = self._sample(req)
            self.samples.append(sample)
            return sample
        self.buffer.add_observation(req, list(reply.observation_ids))
        self.policy.on_ready(req)
        return None

    def fail(self, ticket: ChunkTicket, error: BaseException | None, now: float, *, instance_lost: bool = False) -> None:
        """A chunk raised (or was cancelled) instead of returning: free its KV and put the request
        back as it was after its last completed chunk, so it continues from the tokens received.

        ``instance_lost``: the instance died or hung, which is not the request's fault, so it does
        not count towards ``max_chunk_retries``.
        """
        self._release(ticket)
        req = ticket.request
        self.buffer.requeue(req, now, count_failure=not instance_lost)
        self.events.append(self._event(
            ticket, now, cached_prefix_tokens=0, new_tokens=0, finish_reason="error",
            engine_start_time=ticket.dispatch_time, engine_finish_time=now, request_finished=False,
        ))
        if req.failures > self.max_chunk_retries:
            raise RolloutError(
                f"{req.request_id} failed {req.failures} times; last on {ticket.instance}: {error!r}"
            ) from error
        self.policy.on_ready(req)

    def mark_down(self, instance: str, reason: str, now: float) -> bool:
        """Stop placing chunks on `instance` for the rest of this rollout; False if already down."""
        load = self._load_of[instance]
        if load.down is not None:
            return False
        load.down = reason
        self.dropped.append((instance, reason, now))
        if all(l.down is not None for l in self.loads):
            raise RolloutError("every instance is down: " + "; ".join(f"{n}: {r}" for n, r, _ in self.dropped))
        return True

    def _event(self, ticket: ChunkTicket, now: float, **outcome) -> ChunkEvent:
        req = ticket.request
        return ChunkEvent(
            request_id=req.request_id, chunk_id=ticket.generate.request_id, group_id=req.group_id,
            sample_index=req.sample_index, chunk_index=ticket.chunk_index, instance=ticket.instance,
            reason=ticket.reason, max_tokens=ticket.max_tokens, kv_tokens=ticket.kv_tokens,
            prompt_tokens=len(ticket.generate.prompt_ids), migrated=ticket.migrated,
            dispatch_time=ticket.dispatch_time, complete_time=now, turn=ticket.turn, **outcome,
        )

    def unfinished(self) -> list[Unfinished]:
        """Every request not finished, as it is now (RolloutResult.unfinished; a chunk in flight is
        not counted: a partial rollout aborts it)."""
        out = []
        for req in self.buffer.requests.values():
            if req.status is RequestStatus.FINISHED:
                continue
            ts = self.buffer.turn_state.get(req.request_id)
            instances = req.instances[:-1] if req.status is RequestStatus.RUNNING else req.instances
            out.append(Unfinished(req.request_id, req.group_id, req.sample_index, tuple(req.generated_ids),
                                  tuple(ts.loss_mask) if ts is not None else None, ts.turns if ts is not None else 0,
                                  req.status is RequestStatus.ENV,
                                  tuple(instances), req.status is RequestStatus.RUNNING))
        return out

    def _count_failure(self, req: Request, what: str) -> None:
        req.failures += 1
        if req.failures > self.max_chunk_retries:
            raise RolloutError(f"{req.request_id} failed {req.failures} times; last {what}")

    def _sample(self, req: Request) -> Sample:
        assert req.status is RequestStatus.FINISHED
        ts = self.buffer.turn_state.get(req.request_id)
        return Sample(
            group_id=req.group_id,
            sample_index=req.sample_index,
            request_id=req.request_id,
            prompt=self.buffer.groups[req.group_id].prompt,
            response_ids=list(req.generated_ids),
            logprobs=list(req.logprobs),
            finish_reason=req.finish_reason or "length",
            start_time=req.first_start if req.first_start is not None else 0.0,
            finish_time=req.last_finish if req.last_finish is not None else 0.0,
            instances=list(req.instances),
            weight_version=self.weight_version,
            loss_mask=list(ts.loss_mask) if ts is not None else None,
            turns=ts.turns if ts is not None else 1,
        )
