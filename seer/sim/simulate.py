"""Discrete-event simulation of one rollout iteration: the real Dispatcher and policy, modelled instances.

The loop is the async driver's, on virtual time: dispatch every decision until the policy says
Wait, then jump to the earliest instance event, feed finished chunks back through
`Dispatcher.complete`, repeat. The policies, chunking, KV-budget placement and bookkeeping are
the production code (`seer.scheduler`); only the engines are models (`seer.sim.instance`).
Statistics come from `seer.rollout.divided.stats_from_result`, as for a real run.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from seer.types import Telemetry
from seer.rollout.divided import stats_from_result
from seer.types import GenerateResult, IterationStats, PromptSpec, SamplingParams
from seer.scheduler import SchedulerConfig
from seer.scheduler.decisions import Wait
from seer.scheduler.dispatcher import ChunkTicket, Dispatcher, RolloutError
from seer.scheduler.driver import RolloutResult
from seer.watch.trace import build_trace, write_trace

from seer.sim.ladder import BenchConfig
from seer.sim.chunk_model import ChunkCost
from seer.sim.hardware import MODELS, alltoall_per_position_s, attention_ridge_positions, dp_local_share
from seer.sim.hardware import roofline as roofline_step
from seer.sim.instance import POOL_VS_PREFILL, SimInstance, SimSeq
from seer.sim.speculation import AcceptanceTable, SpecCost
from seer.sim.step_model import StepModel
from seer.sim.workloads import LengthKey, Workload


@dataclass(frozen=True)
class SimSettings:
    step: StepModel  # measured here, for one device; spread over an instance's GPUs
    acceptance: AcceptanceTable
    pool_vs_prefill: float = POOL_VS_PREFILL
    gamma_max: int = 8
    timeline_points: int = 300  # per instance, for plots
    roofline: bool = False  # paper workloads only: the step model from the model's and the GPU's sizes
    # What every chunk costs beyond its steps (seer/sim/chunk_model.py): measured here by
    # bench.sim.measure_chunks (load_chunk_costs()); GPU_CLUSTER for the paper's scenarios (bench.sim.run).
    chunk_cost: ChunkCost = ChunkCost()
    # False: no KV pool, as bench.compare's instances: a chunk that changes instance recomputes its
    # prefix there (a prefill that holds the instance up), and placement keeps chunks with their prefix.
    kv_pool: bool = True
    block_size: int | None = None  # the instances' KV block (real tokens): chunks aligned to it; None: 1 unit
    # SchedulerConfig fields set for every configuration (`python -m bench.sim --sched FIELD=VALUE`),
    # e.g. (("early_packing", True),): options a policy does not take are ignored by it.
    scheduler: tuple[tuple[str, object], ...] = ()
    # What verifying drafts costs (seer.sim.speculation.SpecCost): the roofline's for the paper's
    # scenarios, this machine's measured breakdown for a replay of a run here (replay_compare).
    spec_cost: SpecCost = SpecCost()

    def instance_step(self, workload: Workload) -> StepModel:
        """The step model of one of `workload`'s instances."""
        if self.roofline:
            return roofline_step(MODELS[workload.name], workload.gpus_per_instance, dp_ranks=workload.dp_ranks)
        return self.step.parallel(workload.gpus_per_instance)

    @staticmethod
    def attention_ridge(workload: Workload) -> float:
        """Query positions beyond which the paper's model's attention is compute-bound on an H800
        (either step model: it is the model's and the GPU's, not the step fit's); none otherwise."""
        m = MODELS.get(workload.name)
        return attention_ridge_positions(m) if m else math.inf

    @staticmethod
    def alltoall_per_position(workload: Workload) -> float:
        """Expert-parallel all-to-all seconds per position on a rank (either step model: it is the
        network's; DeepEP's published H800 numbers), for a model whose experts span the instance."""
        m = MODELS.get(workload.name)
        return alltoall_per_position_s(m, workload.gpus_per_instance) if m and workload.dp_ranks > 1 else 0.0

    @staticmethod
    def local_share(workload: Workload) -> float:
        """Under DP attention, the share of a position's compute done on its own rank."""
        m = MODELS.get(workload.name)
        return dp_local_share(m) if m and workload.dp_ranks > 1 else 1.0


@dataclass
class SimRun:
    config: str
    stats: IterationStats
    mean_acceptance_length: float | None
    sim_seconds: float  # how long the simulation itself took (wall)
    sim_cpu_seconds: float  # and its CPU time (the machine is shared: wall time varies with the load)
    first_dispatch: list[str]  # request ids in the order of their first chunk's dispatch


def _units(tokens: float, unit: int) -> int:
    return max(1, int(round(tokens / unit)))


def _references(disp: Dispatcher, ticket: ChunkTicket) -> int:
    """Siblings already past this request's position: the group tree's references for its drafts."""
    req = ticket.request
    return sum(1 for r in disp.buffer.groups[req.group_id].requests if r is not req and r.generated > req.generated)


def simulate(workload: Workload, config: BenchConfig, hidden: dict[LengthKey, int], settings: SimSettings,
             seed: int = 0, oracle_lengths: dict[LengthKey, int] | None = None, trace_to: Path | None = None) -> SimRun:
    """One iteration of `workload` under `config`; `hidden` are the real-token target lengths.
    `trace_to`: also write the iteration's chunk timeline there, in the format seer-run writes
    (seer.watch.trace), so simulated and real schedules open side by side in one viewer.

    Only the oracle policy is handed lengths (through make_policy, which refuses them to any
    other policy): `oracle_lengths`, by default the true ones. The instances use `hidden` to know
    when a response ends, as a real model would.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    u = workload.token_unit
    hidden_u = {k: min(_units(v, u), _units(workload.max_tokens, u)) for k, v in hidden.items()}
    cap = _units(workload.kv_capacity_tokens, u)
    sched = SchedulerConfig(
        policy=config.policy, chunk_size=_units(config.chunk_size or workload.chunk_size, u),
        block_size=_units(settings.block_size, u) if settings.block_size else 1,
        affinity_gap_tokens=_units(512, u), kv_capacity_tokens=cap,
        max_running=workload.max_num_seqs * workload.dp_ranks, kv_pool=settings.kv_pool,
    )
    if settings.scheduler or config.sched:  # run-wide `--sched`, then the configuration's own `+FIELD=VALUE`
        sched = replace(sched, **dict(settings.scheduler), **dict(config.sched))
    told = hidden if oracle_lengths is None else oracle_lengths
    policy = sched.build_policy({k: _units(v, u) for k, v in told.items()} if config.oracle else None)
    prompt = [7] * _units(workload.prompt_tokens, u)
    prompts = [PromptSpec(g, f"g{g}", prompt, {}) for g in range(workload.groups)]
    names = [f"inst{i}" for i in range(workload.instances)]
    disp = Dispatcher(prompts, workload.group_size, SamplingParams(max_tokens=_units(workload.max_tokens, u), seed=seed),
                      policy, names, kv_capacity_tokens=cap)
    # The engines schedule by the chunks' priorities when the policy sends them (vLLM's priority
    # scheduling, as seer starts its instances); otherwise FCFS, which with every priority 0 is the
    # same schedule (seer/sim/instance.py).
    insts = make_instances(workload, settings, names, cap, speculate=config.speculate,
                           priority_scheduling=sched.engine_priority)
    heap: list[tuple[float, int, str]] = []
    version = {n: 0 for n in names}

    def schedule(name: str) -> None:
        version[name] += 1
        t = insts[name].next_event()
        if t < math.inf:
            heapq.heappush(heap, (t, version[name], name))

    now = 0.0
    first_dispatch: list[str] = []
    while not disp.done:
        touched = set()
        while not isinstance(d := disp.next_decision(), Wait):
            ticket = disp.start(d, now)
            req = ticket.request
            if ticket.chunk_index == 0:
                first_dispatch.append(req.request_id)
            remaining = hidden_u[(req.group_id, req.sample_index)] - req.generated
            goal = max(0, min(ticket.max_tokens, remaining))
            context = len(ticket.generate.prompt_ids)
            # A chunk that stays finds its prefix in the instance's prefix cache. One that moves loads
            # it from the KV pool (timed by the instance, on the rank it lands on) or, without a
            # pool, recomputes it there.
            recompute = ticket.chunk_index == 0 or (ticket.migrated and not settings.kv_pool)
            prefill = context if recompute else 0.0
            seq = SimSeq(ticket, float(context), goal, remaining <= ticket.max_tokens, 0.0, float(prefill),
                         probe=req.sample_index == 0, migrated=ticket.migrated and settings.kv_pool,
                         priority=ticket.generate.priority)
            if config.speculate:
                seq.accept = settings.acceptance.accept_rate(_references(disp, ticket))
            insts[ticket.instance].submit(seq, now)
            touched.add(ticket.instance)
        for name in touched:
            schedule(name)
        while heap and heap[0][1] != version[heap[0][2]]:
            heapq.heappop(heap)  # stale
        if not heap:
            raise RolloutError(f"simulation stalled with {len(disp.buffer) - disp.buffer.num_finished} requests left")
        now, _, name = heapq.heappop(heap)
        inst = insts[name]
        for seq in inst.on_event(now):
            t = seq.ticket
            n = int(round(seq.made))
            disp.complete(t, GenerateResult(
                t.generate.request_id, [0] * n, [], "stop" if seq.stops else "length",
                len(t.generate.prompt_ids) if t.chunk_index > 0 else 0, len(t.generate.prompt_ids),
                name, now, now), now)
        schedule(name)

    telemetry = _telemetry(insts, cap, u, settings.timeline_points)
    result = RolloutResult(policy.name, sorted(disp.samples, key=lambda s: (s.group_id, s.sample_index)),
                           list(disp.events), telemetry, 0.0, now, policy.summary())
    stats = stats_from_result(result, 0, names)
    if trace_to is not None:
        write_trace(trace_to, build_trace(result.chunks, telemetry, [("generate", 0.0, now)], instances=names,
                                          metadata={"simulated": workload.name, "config": config.name,
                                                    "token_unit": u, "seed": seed}))
    # Report tokens in real units, whatever the simulator's granularity.
    stats.output_tokens *= u
    stats.tokens_per_s *= u
    for i in stats.instances:
        i.output_tokens *= u
    spec_rows = sum(i.spec_rows for i in insts.values())
    mal = sum(i.spec_tokens for i in insts.values()) / spec_rows if spec_rows else None
    stats.extra["token_unit"] = u
    stats.extra["mean_acceptance_length"] = mal
    stats.extra["longest_queued_s"] = longest_queued_s(disp.events, hidden)
    stats.extra["pool_loads"] = sum(i.pool_loads for i in insts.values())
    stats.extra["dp_ranks"] = workload.dp_ranks
    stats.extra["mean_running"], stats.extra["mean_kv_used"] = busy_means(insts.values())
    return SimRun(config.name, stats, mal, time.perf_counter() - t0, time.process_time() - c0, first_dispatch)


def make_instances(workload: Workload, settings: SimSettings, names: list[str], cap: int, *,
                   speculate: bool = False, priority_scheduling: bool = False) -> dict[str, SimInstance]:
    """The modelled engines of `workload` (`cap` KV units each), as `settings` price their steps."""
    step = settings.instance_step(workload)
    u = workload.token_unit
    return {n: SimInstance(n, cap, workload.max_num_seqs, step, u, speculate=speculate,
                           gamma_max=settings.gamma_max, block=max(16 / u, 1e-3), ranks=workload.dp_ranks,
                           local_share=settings.local_share(workload),
                           ridge_positions=settings.attention_ridge(workload),
                           alltoall_per_position_s=settings.alltoall_per_position(workload),
                           spec_cost=settings.spec_cost,
                           pool_vs_prefill=settings.pool_vs_prefill,
                           chunk_latency_s=settings.chunk_cost.latency_s,
                           chunk_instance_s=settings.chunk_cost.instance_s,
                           priority_scheduling=priority_scheduling) for n in names}


def busy_means(insts) -> tuple[float, float]:
    """Time-weighted means, over the instances' busy time (a chunk running), of the chunks running
    per instance and of the KV actually held (share of capacity). With reservation-bounded
    admission the scheduler books context + a whole chunk per running chunk, so the KV held stays
    well under the 95% it may book: these two say how much batch that costs."""
    run = kv = span = 0.0
    for inst in insts:
        tl = inst.timeline
        for a, b in zip(tl, tl[1:]):
            if a.running > 0:
                dt = b.t - a.t
                run += a.running * dt
                kv += a.kv_usage * dt
                span += dt
    return (run / span, kv / span) if span > 0 else (0.0, 0.0)


def longest_queued_s(events, hidden: dict[LengthKey, int], share: float = 0.05) -> float:
    """Mean time the longest `share` of requests spent waiting for a slot: before their first
    chunk, and between each chunk's end and the next one's dispatch.

    It bounds what ordering can win: a policy that starts and resumes the longest requests sooner
    can shorten the iteration by at most about this much (the oracle's head start).
    """
    by_request: dict[LengthKey, list] = {}
    for e in events:
        by_request.setdefault((e.group_id, e.sample_index), []).append(e)
    n = max(1, int(round(share * len(by_request))))
    longest = sorted(by_request, key=lambda k: -hidden[k])[:n]
    waits = []
    for k in longest:
        chunks = sorted(by_request[k], key=lambda e: e.chunk_index)
        waits.append(chunks[0].dispatch_time + sum(b.dispatch_time - a.complete_time for a, b in zip(chunks, chunks[1:])))
    return sum(waits) / len(waits) if waits else 0.0


def _telemetry(insts: dict[str, SimInstance], cap: int, unit: int, points: int) -> list[Telemetry]:
    """The instances' timelines as Telemetry records (thinned), so stats and plots match real runs."""
    out = []
    for name, inst in insts.items():
        tl = inst.timeline
        stride = max(1, len(tl) // points)
        picked = tl[::stride] + ([tl[-1]] if tl else [])
        out.append(Telemetry(name, 0.0, 0.0, cap * unit, 0, 0, 0))
        out += [Telemetry(name, s.t, s.kv_usage, cap * unit, s.running, s.waiting, s.preemptions) for s in picked]
    return out
