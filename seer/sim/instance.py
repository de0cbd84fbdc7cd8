"""A modelled vLLM instance: continuous batching, FCFS or priority admission, recompute preemption.

What it reproduces of vLLM (V1 scheduler) is what decides rollout throughput:
  * requests wait in FCFS order and are admitted while their context fits in free KV (the head
    of the queue blocks the rest) and the batch is below max_num_seqs;
  * running requests grow by one KV slot per generated token; when KV runs out, the most
    recently admitted request is preempted: its KV is freed, it goes back to the front of the
    queue, and on readmission its whole context is prefilled again (recompute);
  * with `priority_scheduling` (vLLM's `--scheduling-policy priority`) the chunks' engine
    priorities decide instead: the waiting queue is ordered by (priority, arrival) (lower first;
    a preempted request goes back in at its place, not to the front) and the victim is the
    running request with the largest (priority, arrival) (vllm/v1/core/sched/scheduler.py,
    request_queue.py). Arrival is the order of submission to the instance. With every priority
    equal this is the FCFS schedule: the head blocks, so admission follows arrival, the most
    recently admitted is the latest arrival and a victim's place by arrival is the queue's front;
  * every step takes the step model's time for its batch and context; speculation turns a step
    into g + 1 positions per request that yield an acceptance-length's worth of tokens, and the
    drafting (the DGDS lookup, on the step's critical path) is added to the step. Attention reads
    each request's KV once per step; with more query positions than `ridge_positions` it becomes
    compute-bound and costs proportionally more (`seer.sim.hardware.attention_multiplier`).
Data-parallel attention (`ranks` > 1, vLLM's DP attention with expert parallelism, as Kimi-K2's
DP32/EP32 instances): the instance is `ranks` engines, each with its own scheduler, its own KV
pool (capacity / ranks) and its own max_num_seqs. A request is routed to a rank when it arrives by
vLLM's DP load balancer (the lowest 4 x waiting + running, lowest rank on ties; it does not look
at KV) and stays there: it is preempted and recomputed on that rank, so one rank can preempt
while the others have room. A chunk that lands on another rank than its request's previous chunk
loads its prefix from the KV pool, as a migrated chunk does. The ranks step in lock-step (the
expert-parallel layers exchange tokens every layer), so a step costs the slowest rank: its own
attention and the share `local_share` of each position's compute that runs on the rank
(attention projections, dense layers, shared experts), plus the routed experts' share of the
whole instance's positions, spread over every GPU. A prefill holds up the whole instance, for the
prefilling rank's local share and, instance-wide, the experts' share.
Progress is fluid between events (all running requests advance at their rate per step), so an
instance costs O(batch) per event, not per token. Between events the step time grows linearly
with the steps taken (every request's context grows by its rate per step), and time and steps
are converted exactly under that growth, not at the context the interval started with (with
several ranks, the slowest rank's growth, re-priced at least every `max_epoch_steps`). Token
quantities are in simulator units (`unit` real tokens each); times are real seconds.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field, replace

from seer.scheduler.dispatcher import ChunkTicket

from seer.sim.speculation import DRAFT_US_PER_TOKEN, SpecCost, attention_multiplier, plan
from seer.sim.step_model import StepModel

EPS = 1e-9
POOL_VS_PREFILL = 0.09  # KV-pool load time / recompute time per token, measured in docs/kvpool.md


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
    migrated: bool = False  # its prefix is on another instance: the instance charges the pool load
    made: float = 0.0
    rate: float = 1.0  # tokens per step
    attn: float = 1.0  # attention cost per context token, relative to one query position
    ready_at: float = 0.0
    admitted: int = -1
    preempted: int = 0
    rank: int = -1  # the DP rank (KV pool) it runs on
    priority: int = 0  # the chunk's engine priority (vLLM: lower is scheduled first and preempted last)
    arrival: int = -1  # order of arrival at the instance (vLLM's arrival_time, ties impossible)

    @property
    def remaining(self) -> float:
        return self.goal - self.made


def _queue_order(s: SimSeq) -> tuple[int, int]:
    """vLLM's priority order (Request.__lt__): priority, then arrival; the largest is the preemption victim."""
    return s.priority, s.arrival


def _admission(s: SimSeq) -> int:
    return s.admitted


@dataclass(frozen=True)
class InstanceSample:
    t: float
    kv_usage: float
    running: int
    waiting: int
    preemptions: int


@dataclass(eq=False)
class RankPool:
    """One engine's scheduler and KV pool: the whole instance, or one DP-attention rank."""

    index: int
    capacity: float  # KV slots (units)
    running: list[SimSeq] = field(default_factory=list)
    waiting: deque[SimSeq] = field(default_factory=deque)
    used: float = 0.0  # KV held by the running requests, kept incrementally (hot path)
    preemptions: int = 0
    busy_until: float = 0.0  # this rank's own prefill work (DP attention)


@dataclass
class SimInstance:
    name: str
    capacity: float  # KV slots (units), the whole instance's (all ranks together)
    max_num_seqs: int  # per engine (per rank under DP attention), as vLLM's setting is
    step: StepModel  # the whole instance's, for a batch spread evenly over its GPUs
    unit: int
    speculate: bool = False
    gamma_max: int = 8
    block: float = 1.0  # growth headroom per running request at admission (units)
    max_epoch_steps: float = 32.0  # when speculating or under DP, re-price at least this often
    ranks: int = 1  # data-parallel attention ranks, each with its own KV pool
    local_share: float = 1.0  # DP: share of a position's compute on its own rank (the rest: experts)
    ridge_positions: float = math.inf  # query positions per request beyond which attention is compute-bound
    alltoall_per_position_s: float = 0.0  # expert-parallel dispatch + combine per position on a rank (real s)
    spec_cost: SpecCost = SpecCost()  # what verifying drafts adds (seer.sim.speculation.SpecCost)
    pool_vs_prefill: float = POOL_VS_PREFILL
    # vLLM's --scheduling-policy: False: fcfs (priorities ignored), True: priority (see the module docstring)
    priority_scheduling: bool = False
    chunk_latency_s: float = 0.0  # per chunk: out of the engine, not holding it up (seer/sim/chunk_model.py)
    chunk_instance_s: float = 0.0  # per chunk: the instance's own admission time, nobody decodes meanwhile
    now: float = 0.0
    stall_until: float = 0.0  # prefill in progress: nobody decodes
    preemptions: int = 0
    admissions: int = 0
    arrivals: int = 0
    pool_loads: int = 0  # chunks that loaded their prefix from the KV pool (migrated or another rank)
    spec_tokens: float = 0.0  # tokens emitted by speculative steps, and the steps' request-count
    spec_rows: float = 0.0
    timeline: list[InstanceSample] = field(default_factory=list)
    pools: list[RankPool] = field(default_factory=list)
    _step_s: float = 0.0  # seconds per (simulated) step now
    _growth: float = 0.0  # how much _step_s grows per step, as the batch's contexts grow
    _experts_until: float = 0.0  # DP: the experts' share of prefills, instance-wide
    _last_rank: dict[str, int] = field(default_factory=dict)  # request id -> rank of its last chunk here
    _dirty: bool = False  # submitted work not yet admitted

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError("ranks must be >= 1")
        if not self.pools:
            self.pools = [RankPool(i, self.capacity / self.ranks) for i in range(self.ranks)]
        self._attn_by_positions = [attention_multiplier(p, self.ridge_positions) for p in range(self.gamma_max + 2)]

    # -- state ---------------------------------------------------------------------------------
    @property
    def running(self) -> list[SimSeq]:
        return self.pools[0].running if self.ranks == 1 else [s for p in self.pools for s in p.running]

    @property
    def waiting(self) -> list[SimSeq] | deque[SimSeq]:
        return self.pools[0].waiting if self.ranks == 1 else [s for p in self.pools for s in p.waiting]

    @property
    def used(self) -> float:
        return sum(p.used for p in self.pools)

    def _active(self) -> list[SimSeq]:
        return [s for p in self.pools for s in p.running if s.ready_at <= self.now + EPS]

    def settle(self) -> None:
        """Admit what fits and re-price the step; once per event, however many chunks arrived."""
        self._admit()
        self._reprice()
        self._sample()
        self._dirty = False

    def _attn(self, positions: int) -> float:
        """Attention cost per context token with `positions` query positions, relative to one."""
        return self._attn_by_positions[positions]

    def _reprice(self) -> None:
        """Step time and per-request rates for the current batch (Algorithm 1 when speculating).

        Per rank: its positions, its attention (context weighted by the attention multiplier)
        and its drafting; the step costs the slowest rank's share plus the experts' share of all
        positions (with one rank: the step model as it is).
        """
        st, unit, r = self.step, self.unit, self.ranks
        total_positions = 0.0
        worst_cost, worst_growth, any_active = -1.0, 0.0, False
        total_drafted = 0
        # The rank's own planner prices its batch as if every rank had the same (the instance's
        # step model at r times the rank's batch).
        a2a = self.alltoall_per_position_s
        plan_step = st if r == 1 and not a2a else replace(st, per_token_s=st.per_token_s * r + a2a,
                                                          per_context_s=st.per_context_s * r,
                                                          prefill_per_token_s=st.prefill_per_token_s * r)
        for pool in self.pools:
            active = [s for s in pool.running if s.ready_at <= self.now + EPS]
            if not active:
                continue
            any_active = True
            if not self.speculate:
                positions, drafted = float(len(active)), 0
                attn_ctx = rate_attn = 0.0
                m = self._attn(1)
                for s in active:
                    s.rate = 1.0
                    s.attn = m
                    attn_ctx += s.context
                    rate_attn += 1.0
                attn_ctx *= m
                rate_attn *= m
            else:
                ctx = sum(s.context for s in active)
                high = [s.accept for s in active if s.probe]
                low = [s.accept for s in active if not s.probe]
                g = plan(plan_step, unit, ctx, high, low, self.gamma_max, ridge_positions=self.ridge_positions,
                         spec=self.spec_cost)
                positions = drafted = 0
                attn_ctx = rate_attn = 0.0
                for s in active:
                    d = g.high if s.probe else g.low
                    s.rate = (1 - s.accept ** (d + 1)) / (1 - s.accept) if s.accept < 1 else d + 1.0
                    s.attn = self._attn(d + 1)
                    positions += d + 1
                    drafted += d
                    attn_ctx += s.context * s.attn
                    rate_attn += s.rate * s.attn
            total_positions += positions
            total_drafted += drafted
            # Algorithm 1 weighed the drafting time; the step pays it too (the lookup precedes the forward).
            cost = ((self.local_share * r * st.per_token_s + a2a) * positions + r * st.per_context_s * attn_ctx * unit
                    + drafted * DRAFT_US_PER_TOKEN)
            if cost > worst_cost:
                worst_cost, worst_growth = cost, rate_attn
        if not any_active:
            self._step_s = math.inf
            self._growth = 0.0
            return
        # With one rank: fixed + per_token x positions + per_context x context (x attention) + drafting.
        # MoE: the routed experts' weights are read for the experts the step's positions touch.
        # Verifying drafts: what `spec_cost` adds to the drafted positions' price (0 on the roofline).
        self._step_s = unit * (st.fixed_s + st.experts_read_s(total_positions)
                               + (1.0 - self.local_share) * st.per_token_s * total_positions + worst_cost
                               + (self.spec_cost.extra_s(st, total_drafted) if self.speculate else 0.0))
        # Every step adds `rate` units of context per request, so the step time grows by this much per step.
        self._growth = unit * r * st.per_context_s * unit * worst_growth

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
        running = sum(len(p.running) for p in self.pools)
        waiting = sum(len(p.waiting) for p in self.pools)
        self.timeline.append(InstanceSample(self.now, min(1.0, self.used / self.capacity), running, waiting,
                                            self.preemptions))

    # -- time ----------------------------------------------------------------------------------
    def next_event(self) -> float:
        """When something changes here: a chunk ends, KV runs out, a load or prefill ends."""
        if self._dirty:
            self.settle()
        if not any(p.running for p in self.pools):
            return math.inf
        if self.stall_until > self.now + EPS:
            return self.stall_until
        t = math.inf
        steps = math.inf
        for pool in self.pools:
            rate = 0.0
            for s in pool.running:
                if s.ready_at > self.now + EPS:
                    t = min(t, s.ready_at)
                    continue
                steps = min(steps, (s.goal - s.made) / s.rate)
                rate += s.rate
            if len(pool.running) > 1 and rate > 0.0:  # a lone request runs even if it outgrows the cache (vLLM would too)
                steps = min(steps, max(pool.capacity - pool.used, 0.0) / rate)
        if steps == math.inf:
            return t
        # The step time is exact between events; Algorithm 1's plan and which rank is slowest are not.
        if self.speculate or self.ranks > 1:
            steps = min(steps, self.max_epoch_steps)
        return min(t, self.now + self._time_for(max(steps, 0.0)))

    def advance(self, to: float) -> None:
        """Generate up to time `to` (never past next_event, which the caller guarantees)."""
        if to <= self.now:
            return
        start = max(self.now, self.stall_until)
        if start < to and self._step_s < math.inf:
            steps = self._steps_in(to - start)
            for pool in self.pools:
                grown = 0.0
                for s in pool.running:
                    if s.ready_at <= start + EPS:
                        n = min(s.rate * steps, s.goal - s.made)
                        s.made += n
                        s.context += n
                        grown += n
                        if self.speculate:
                            self.spec_tokens += n
                            self.spec_rows += n / s.rate
                pool.used += grown
            self._step_s += self._growth * steps  # the contexts it is priced on have grown
        self.now = to

    def on_event(self, now: float) -> list[SimSeq]:
        """Advance to `now`; return the chunks that finished; preempt and admit as vLLM would."""
        self.advance(now)
        done: list[SimSeq] = []
        for pool in self.pools:
            ended = [s for s in pool.running if s.goal - s.made <= 1e-6]
            if ended:
                pool.running = [s for s in pool.running if s.goal - s.made > 1e-6]
                pool.used -= sum(s.context for s in ended)
                done += ended
            # Out of KV: preempt until the batch fits again; the victim is the most recently admitted
            # (FCFS) or the largest (priority, arrival) (priority scheduling).
            while len(pool.running) > 1 and pool.used > pool.capacity - EPS:
                victim = max(pool.running, key=_queue_order if self.priority_scheduling else _admission)
                pool.running.remove(victim)
                pool.used -= victim.context
                victim.preempted += 1
                victim.prefill = victim.context  # recompute the whole context on readmission (same rank)
                self._enqueue(pool, victim, preempted=True)
                pool.preemptions += 1
                self.preemptions += 1
        self.settle()
        return done

    def submit(self, seq: SimSeq, now: float) -> None:
        """Queue a chunk on its rank; it is admitted at the next settle() (or next_event())."""
        self.advance(now)
        pool = self._route()
        rid = seq.ticket.request.request_id
        prev = self._last_rank.get(rid)
        seq.rank = pool.index
        self._last_rank[rid] = pool.index
        # The prefix is elsewhere (another instance, or another rank's HBM): load it from the pool.
        if seq.migrated or (prev is not None and prev != pool.index):
            seq.load_s = self.pool_vs_prefill * self._prefill_parts(seq.context)[0]
            self.pool_loads += 1
        # Every chunk is a request to the instance: its round trip delays it, its admission holds
        # the instance (chunks arriving together queue behind each other).
        seq.load_s += self.chunk_latency_s
        if self.chunk_instance_s > 0.0:
            self.stall_until = max(self.stall_until, self.now) + self.chunk_instance_s
        seq.arrival = self.arrivals
        self.arrivals += 1
        self._enqueue(pool, seq)
        self._dirty = True

    def _enqueue(self, pool: RankPool, seq: SimSeq, preempted: bool = False) -> None:
        """FCFS: new chunks at the back, preempted ones at the front; priority: in (priority, arrival) order."""
        if self.priority_scheduling:
            bisect.insort(pool.waiting, seq, key=_queue_order)
        elif preempted:
            pool.waiting.appendleft(seq)
        else:
            pool.waiting.append(seq)

    def _route(self) -> RankPool:
        """vLLM's DP load balancer: the rank with the lowest 4 x waiting + running (lowest index on ties)."""
        if self.ranks == 1:
            return self.pools[0]
        return min(self.pools, key=lambda p: (4 * len(p.waiting) + len(p.running), p.index))

    def _prefill_parts(self, tokens: float) -> tuple[float, float]:
        """Seconds a prefill of `tokens` units keeps (its rank, the whole instance's experts) busy.

        One rank: the step model's prefill. DP attention: the rank computes its local share alone
        (r times the balanced per-GPU rate), the routed experts' share is spread over every GPU.
        """
        p = self.step.prefill_s(tokens * self.unit)  # in units: unit x tokens real tokens, timed once
        if self.ranks == 1:
            return p, 0.0
        return (self.local_share * self.ranks + 1.0 - self.local_share) * p, (1.0 - self.local_share) * p

    def _admit(self) -> None:
        for pool in self.pools:
            used = pool.used
            while pool.waiting and len(pool.running) < self.max_num_seqs:
                head = pool.waiting[0]
                headroom = self.block * (len(pool.running) + 1)
                if pool.running and used + head.context + headroom > pool.capacity:
                    break  # the head blocks the queue (under either policy)
                pool.waiting.popleft()
                if head.prefill > 0:
                    rank_s, experts_s = self._prefill_parts(head.prefill)
                    pool.busy_until = max(pool.busy_until, self.now) + rank_s
                    self._experts_until = max(self._experts_until, self.now) + experts_s
                    # Lock-step: nobody decodes while any rank prefills.
                    self.stall_until = max(self.stall_until, pool.busy_until, self._experts_until)
                    head.prefill = 0.0
                head.ready_at = max(self.now, self.stall_until) + head.load_s
                head.load_s = 0.0
                head.admitted = self.admissions
                self.admissions += 1
                pool.running.append(head)
                used += head.context
                pool.used += head.context
