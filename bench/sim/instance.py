"""A modelled vLLM instance: continuous batching, FCFS admission, recompute preemption.

What it reproduces of vLLM (V1 scheduler) is what decides rollout throughput:
  * requests wait in FCFS order and are admitted while their context fits in free KV (the head
    of the queue blocks the rest) and the batch is below max_num_seqs;
  * running requests grow by one KV slot per generated token; when KV runs out, the most
    recently admitted request is preempted: its KV is freed, it goes back to the front of the
    queue, and on readmission its whole context is prefilled again (recompute);
  * every step takes the step model's time for its batch and context; speculation turns a step
    into g + 1 positions per request that yield an acceptance-length's worth of tokens, and the
    drafting (the DGDS lookup, on the step's critical path) is added to the step.
Progress is fluid between events (all running requests advance at their rate per step), so an
instance costs O(batch) per event, not per token. Between events the step time grows linearly
with the steps taken (every request's context grows by its rate per step), and time and steps
are converted exactly under that growth, not at the context the interval started with. Token
quantities are in simulator units (`unit` real tokens each); times are real seconds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from seer.scheduler.dispatcher import ChunkTicket

from bench.sim.speculation import DRAFT_US_PER_TOKEN, plan
from bench.sim.step_model import StepModel

EPS = 1e-9


@dataclass(eq=False)
class SimSeq:
    """One chunk on the instance."""

    ticket: ChunkTicket
    context: float  # KV it holds when running: prompt + everything generated so far
    goal: int  # tokens this chunk produces (chunk limit or the hidden end of the request)
    stops: bool  # whether reaching `goal` is the request's end (EOS) rather than the chunk limit
    load_s: float  # delay before its first step: pool transfer of a migrated prefix (per request)
    prefill: float  # tokens computed on admission (first prompt, or a recompute after preemption)
    accept: float = 0.0  # per-position acceptance under speculation
    probe: bool = False
    made: float = 0.0
    rate: float = 1.0  # tokens per step
    ready_at: float = 0.0
    admitted: int = -1
    preempted: int = 0

    @property
    def remaining(self) -> float:
        return self.goal - self.made


@dataclass(frozen=True)
class InstanceSample:
    t: float
    kv_usage: float
    running: int
    waiting: int
    preemptions: int


@dataclass
class SimInstance:
    name: str
    capacity: float  # KV slots (units)
    max_num_seqs: int
    step: StepModel
    unit: int
    speculate: bool = False
    gamma_max: int = 8
    block: float = 1.0  # growth headroom per running request at admission (units)
    max_epoch_steps: float = 32.0  # when speculating, re-plan draft lengths at least this often
    now: float = 0.0
    stall_until: float = 0.0  # prefill in progress: nobody decodes
    running: list[SimSeq] = field(default_factory=list)
    waiting: deque[SimSeq] = field(default_factory=deque)
    preemptions: int = 0
    admissions: int = 0
    spec_tokens: float = 0.0  # tokens emitted by speculative steps, and the steps' request-count
    spec_rows: float = 0.0
    timeline: list[InstanceSample] = field(default_factory=list)
    _step_s: float = 0.0  # seconds per (simulated) step now
    _growth: float = 0.0  # how much _step_s grows per step, as the batch's contexts grow
    _used: float = 0.0  # KV held by the running requests, kept incrementally (hot path)
    _dirty: bool = False  # submitted work not yet admitted

    # -- state ---------------------------------------------------------------------------------
    @property
    def used(self) -> float:
        return self._used

    def _active(self) -> list[SimSeq]:
        return [s for s in self.running if s.ready_at <= self.now + EPS]

    def settle(self) -> None:
        """Admit what fits and re-price the step; once per event, however many chunks arrived."""
        self._admit()
        self._reprice()
        self._sample()
        self._dirty = False

    def _reprice(self) -> None:
        """Step time and per-request rates for the current batch (Algorithm 1 when speculating)."""
        active = self._active()
        ctx = sum(s.context for s in active)
        if not active:
            self._step_s = math.inf
            self._growth = 0.0
            return
        if not self.speculate:
            for s in active:
                s.rate = 1.0
            self._step_s = self.unit * self.step.step_s(len(active), ctx * self.unit)
        else:
            high = [s.accept for s in active if s.probe]
            low = [s.accept for s in active if not s.probe]
            g = plan(self.step, self.unit, ctx, high, low, self.gamma_max)
            positions = drafted = 0
            for s in active:
                d = g.high if s.probe else g.low
                s.rate = (1 - s.accept ** (d + 1)) / (1 - s.accept) if s.accept < 1 else d + 1.0
                positions += d + 1
                drafted += d
            # Algorithm 1 weighed the drafting time; the step pays it too (the lookup precedes the forward).
            self._step_s = self.unit * (self.step.step_s(positions, ctx * self.unit) + drafted * DRAFT_US_PER_TOKEN)
        # Every step adds `rate` units of context per request, so the step time grows by this much per step.
        self._growth = self.unit * self.step.per_context_s * self.unit * sum(s.rate for s in active)

    def _time_for(self, steps: float) -> float:
        """Seconds for `steps` steps from now: the step time grows linearly as contexts grow."""
        return steps * self._step_s + 0.5 * self._growth * steps * steps

    def _steps_in(self, seconds: float) -> float:
        """Inverse of _time_for: the steps taken in `seconds`."""
        if self._growth <= 0.0:
            return seconds / self._step_s
        a, g = self._step_s, self._growth
        return 2.0 * seconds / (a + math.sqrt(a * a + 2.0 * g * seconds))  # stable form of (-a + sqrt(a^2 + 2gs)) / g

    def _sample(self) -> None:
        self.timeline.append(InstanceSample(self.now, min(1.0, self.used / self.capacity), len(self.running),
                                            len(self.waiting), self.preemptions))

    # -- time ----------------------------------------------------------------------------------
    def next_event(self) -> float:
        """When something changes here: a chunk ends, KV runs out, a load or prefill ends."""
        if self._dirty:
            self.settle()
        if not self.running:
            return math.inf
        if self.stall_until > self.now + EPS:
            return self.stall_until
        t = math.inf
        pending = [s.ready_at for s in self.running if s.ready_at > self.now + EPS]
        if pending:
            t = min(pending)
        active = self._active()
        if not active:
            return t
        steps = min((s.goal - s.made) / s.rate for s in active)
        if len(self.running) > 1:  # a lone request runs even if it outgrows the cache (vLLM would too)
            room = self.capacity - self._used
            steps = min(steps, max(room, 0.0) / sum(s.rate for s in active))
        if self.speculate:  # the step time is exact between events; Algorithm 1's plan is not
            steps = min(steps, self.max_epoch_steps)
        return min(t, self.now + self._time_for(max(steps, 0.0)))

    def advance(self, to: float) -> None:
        """Generate up to time `to` (never past next_event, which the caller guarantees)."""
        if to <= self.now:
            return
        start = max(self.now, self.stall_until)
        if start < to and self._step_s < math.inf:
            steps = self._steps_in(to - start)
            grown = 0.0
            for s in self.running:
                if s.ready_at <= start + EPS:
                    n = min(s.rate * steps, s.goal - s.made)
                    s.made += n
                    s.context += n
                    grown += n
                    if self.speculate:
                        self.spec_tokens += n
                        self.spec_rows += n / s.rate
            self._used += grown
            self._step_s += self._growth * steps  # the contexts it is priced on have grown
        self.now = to

    def on_event(self, now: float) -> list[SimSeq]:
        """Advance to `now`; return the chunks that finished; preempt and admit as vLLM would."""
        self.advance(now)
        done = [s for s in self.running if s.goal - s.made <= 1e-6]
        if done:
            self.running = [s for s in self.running if s.goal - s.made > 1e-6]
            self._used -= sum(s.context for s in done)
        # Out of KV: preempt the most recently admitted (vLLM's FCFS victim) until the batch fits again.
        while self.running and self.used > self.capacity - EPS and len(self.running) > 1:
            victim = max(self.running, key=lambda s: s.admitted)
            self.running.remove(victim)
            self._used -= victim.context
            victim.preempted += 1
            victim.prefill = victim.context  # recompute the whole context on readmission
            self.waiting.appendleft(victim)
            self.preemptions += 1
        self.settle()
        return done

    def submit(self, seq: SimSeq, now: float) -> None:
        """Queue a chunk; it is admitted at the next settle() (or next_event())."""
        self.advance(now)
        self.waiting.append(seq)
        self._dirty = True

    def _admit(self) -> None:
        used = self.used
        while self.waiting and len(self.running) < self.max_num_seqs:
            head = self.waiting[0]
            headroom = self.block * (len(self.running) + 1)
            if self.running and used + head.context + headroom > self.capacity:
                break  # FCFS: the head blocks the queue
            self.waiting.popleft()
            if head.prefill > 0:
                # prefill is in units: unit x prefill real tokens, timed once (not once per unit, as for steps)
                self.stall_until = max(self.stall_until, self.now) + self.step.prefill_s(head.prefill * self.unit)
                head.prefill = 0.0
            head.ready_at = max(self.now, self.stall_until) + head.load_s
            head.load_s = 0.0
            head.admitted = self.admissions
            self.admissions += 1
            self.running.append(head)
            used += head.context
            self._used += head.context
