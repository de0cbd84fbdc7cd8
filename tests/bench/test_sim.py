"""The simulator's parts: step-time fit, lengths, the modelled vLLM instance, metrics, the oracle's input."""

import math
from dataclasses import replace

import numpy as np
import pytest

from seer.sim.ladder import BY_NAME, LADDER, select
from seer.sim.instance import SimInstance, SimSeq
from seer.sim.simulate import SimSettings, simulate
from seer.sim.speculation import DRAFT_US_PER_TOKEN, AcceptanceTable, accept_rate_for_length
from seer.sim.step_model import StepModel, fit
from seer.sim.workloads import PAPER_WORKLOADS, SMALL, LengthModel, Workload
from seer.dgds.policy.draft_length import tokens_per_step
from seer.types import GenerateRequest, SamplingParams
from seer.scheduler.buffer import Request
from seer.scheduler.dispatcher import ChunkTicket

STEP = StepModel(fixed_s=2e-3, per_token_s=1e-4, per_context_s=1e-8, prefill_per_token_s=2e-5)
SETTINGS = SimSettings(STEP, AcceptanceTable.paper())


def tiny_workload(**kw) -> Workload:
    base = Workload("t", instances=2, groups=2, group_size=2, max_tokens=1000, mean_tokens=100, prompt_tokens=10,
                    kv_capacity_tokens=100_000, max_num_seqs=64, chunk_size=64)
    return replace(base, **kw)


# -- step-time model ------------------------------------------------------------------------------

def test_fit_recovers_known_coefficients_and_reports_zero_error_on_exact_data():
    true = StepModel(3e-3, 2e-4, 5e-9, 1e-5)
    rows = [{"batch": b, "mean_context": c, "step_s": true.step_s(b, b * c)} for b in (1, 4, 16, 64) for c in (50, 900)]
    pre = [{"prompt_len": p, "wall_s": 0.01 + true.prefill_s(p)} for p in (64, 512, 2048)]
    rep = fit({"decode": rows, "prefill": pre})
    assert rep.model.fixed_s == pytest.approx(true.fixed_s, rel=1e-6)
    assert rep.model.per_token_s == pytest.approx(true.per_token_s, rel=1e-6)
    assert rep.model.per_context_s == pytest.approx(true.per_context_s, rel=1e-4)
    assert rep.model.prefill_per_token_s == pytest.approx(true.prefill_per_token_s, rel=1e-6)
    assert rep.mean_abs_rel_error < 1e-6
    noisy = [dict(r, step_s=r["step_s"] * (1.2 if i % 2 else 0.8)) for i, r in enumerate(rows)]
    rep = fit({"decode": noisy, "prefill": pre})
    assert rep.max_abs_rel_error > 0.1  # the error is measured, not assumed
    assert min(rep.model.fixed_s, rep.model.per_token_s, rep.model.per_context_s) >= 0


def test_parallel_instance_splits_variable_costs_only():
    p = STEP.parallel(8)
    assert p.fixed_s == STEP.fixed_s and p.per_token_s == STEP.per_token_s / 8


# -- lengths --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PAPER_WORKLOADS))
def test_lengths_fit_the_papers_mean_and_max(name):
    w = PAPER_WORKLOADS[name]
    x = np.array(list(w.lengths.sample(2000, w.group_size, 3).values()))
    assert x.max() == w.max_tokens and x.min() >= 16
    assert abs(x.mean() - w.mean_tokens) / w.mean_tokens < 0.05
    assert 0.02 < (x == w.max_tokens).mean() < 0.09  # the fitted truncated share (5%)


def test_lengths_are_correlated_within_groups():
    m = LengthModel(200, 2000, icc=0.8)
    d = m.sample(400, 8, 0)
    logs = np.log(np.array([[d[(g, k)] for k in range(8)] for g in range(400)]))
    within = logs.var(axis=1).mean()
    total = logs.var()
    assert within < 0.5 * total
    flat = LengthModel(200, 2000, icc=0.0).sample(400, 8, 0)
    logs0 = np.log(np.array([[flat[(g, k)] for k in range(8)] for g in range(400)]))
    assert logs0.var(axis=1).mean() > 0.8 * logs0.var()


def test_same_seed_same_hidden_lengths():
    assert SMALL.hidden_lengths(5) == SMALL.hidden_lengths(5) != SMALL.hidden_lengths(6)


# -- the modelled instance ------------------------------------------------------------------------

def _seq(i: int, context: float, goal: int) -> SimSeq:
    req = Request(f"g{i}-s0", i, 0, [1] * int(context), 10_000, i)
    gen = GenerateRequest(f"g{i}-s0-c0", [1] * int(context), goal, SamplingParams(max_tokens=goal))
    ticket = ChunkTicket(req, 0, "a", "t", goal, 0, False, 0.0, gen)
    return SimSeq(ticket, float(context), goal, True, 0.0, 0.0)


def run_instance(inst: SimInstance, seqs: list[SimSeq]) -> dict[str, float]:
    for s in seqs:
        inst.submit(s, 0.0)
    done = {}
    while inst.running or inst.waiting:
        t = inst.next_event()
        assert t < math.inf
        for s in inst.on_event(t):
            done[s.ticket.request.request_id] = t
    return done


def test_overloaded_instance_preempts_the_latest_admitted_and_recomputes_it():
    inst = SimInstance("a", capacity=100, max_num_seqs=8, step=STEP, unit=1)
    seqs = [_seq(i, 10, 40) for i in range(3)]  # 3 x (10 + 40) = 150 > 100 slots
    done = run_instance(inst, seqs)
    assert inst.preemptions >= 1
    assert seqs[2].preempted >= 1 and seqs[0].preempted == 0  # FCFS: the newest is the victim
    assert done["g2-s0"] == max(done.values())
    assert all(s.made == pytest.approx(40) for s in seqs)
    roomy = SimInstance("b", capacity=1000, max_num_seqs=8, step=STEP, unit=1)
    done2 = run_instance(roomy, [_seq(i, 10, 40) for i in range(3)])
    assert roomy.preemptions == 0 and max(done2.values()) < max(done.values())


def test_priority_scheduling_preempts_the_lowest_priority_not_the_newest():
    """vLLM's --scheduling-policy priority: the victim is the running request with the largest
    (priority, arrival), and the waiting queue is ordered by it; with the priorities ignored (FCFS)
    the newest is the victim, and with every priority equal the two agree."""
    def trio(priorities):
        seqs = [_seq(i, 10, 40) for i in range(3)]  # 3 x (10 + 40) = 150 > 100 slots: one is preempted
        for s, p in zip(seqs, priorities):
            s.priority = p
        return seqs

    ranked = [-30, 0, -20]  # a long request's continuation, a fresh request, another continuation
    fcfs = trio(ranked)
    run_instance(SimInstance("a", capacity=100, max_num_seqs=8, step=STEP, unit=1), fcfs)
    assert [s.preempted > 0 for s in fcfs] == [False, False, True]  # FCFS: the newest
    prio = trio(ranked)
    done = run_instance(SimInstance("a", capacity=100, max_num_seqs=8, step=STEP, unit=1, priority_scheduling=True), prio)
    assert [s.preempted > 0 for s in prio] == [False, True, False]  # the lowest priority (largest value)
    assert done["g1-s0"] == max(done.values()) and all(s.made == pytest.approx(40) for s in prio)
    flat = trio([0, 0, 0])
    inst = SimInstance("a", capacity=100, max_num_seqs=8, step=STEP, unit=1, priority_scheduling=True)
    run_instance(inst, flat)
    assert [s.preempted > 0 for s in flat] == [False, False, True] and inst.preemptions == fcfs[2].preempted

    # With equal priorities the two policies are the same schedule, also with arrivals over time
    # and repeated preemptions: admission order stays arrival order (the head blocks), so the most
    # recently admitted is the latest arrival and the front of the queue is its place by arrival.
    def staggered(priority_scheduling):
        inst = SimInstance("a", capacity=120, max_num_seqs=8, step=STEP, unit=1, priority_scheduling=priority_scheduling)
        seqs = [_seq(i, 5 + 3 * i, 30 + 7 * i) for i in range(6)]
        done, t = {}, 0.0
        for k, s in enumerate(seqs):
            inst.submit(s, t)
            t = inst.next_event() if k % 2 else t
            for d in inst.on_event(t):
                done[d.ticket.request.request_id] = t
        done.update(run_instance(inst, []))
        return done, inst.preemptions, [s.preempted for s in seqs]
    fcfs_run, prio_run = staggered(False), staggered(True)
    assert fcfs_run[1] >= 2 and prio_run == fcfs_run

    # Admission: lower priority value first, ties by arrival; the head still blocks (batch limit 2).
    inst = SimInstance("a", capacity=1000, max_num_seqs=2, step=STEP, unit=1, priority_scheduling=True)
    queued = trio([0, 0, -5]) + [_seq(3, 10, 40)]
    for s in queued:
        inst.submit(s, 0.0)
    inst.settle()
    assert inst.running == [queued[2], queued[0]] and list(inst.waiting) == [queued[1], queued[3]]
    # A preempted request goes back in at its (priority, arrival) place, not to the front.
    victim = queued[0]
    inst.running.remove(victim)
    inst.pools[0].used -= victim.context
    inst._enqueue(inst.pools[0], victim, preempted=True)
    assert list(inst.waiting) == [victim, queued[1], queued[3]]
    late = _seq(4, 10, 40)
    late.priority = 3
    inst._enqueue(inst.pools[0], late, preempted=True)
    assert list(inst.waiting)[-1] is late


def test_fcfs_head_blocks_admission_and_batch_limit_holds():
    inst = SimInstance("a", capacity=100, max_num_seqs=2, step=STEP, unit=1)
    for s in [_seq(i, 10, 5) for i in range(4)]:
        inst.submit(s, 0.0)
    inst.settle()
    assert len(inst.running) == 2 and len(inst.waiting) == 2


def test_decode_time_follows_the_step_model():
    inst = SimInstance("a", capacity=10_000, max_num_seqs=8, step=STEP, unit=1)
    done = run_instance(inst, [_seq(0, 10, 100)])
    # 100 steps at batch 1; context grows 10 -> 110 (re-priced every 32 steps), plus no prefill.
    lo, hi = 100 * STEP.step_s(1, 10), 100 * STEP.step_s(1, 110)
    assert lo <= done["g0-s0"] <= hi


def test_token_unit_is_a_granularity_not_a_cost():
    """The same real work (prefill 640 tokens, decode 64) takes the same time at unit 1 and 64."""
    times = []
    for unit in (1, 64):
        inst = SimInstance("a", capacity=10_000, max_num_seqs=8, step=STEP, unit=unit)
        seq = _seq(0, 640 / unit, 64 // unit)
        seq.prefill = 640 / unit
        times.append(run_instance(inst, [seq])["g0-s0"])
    expected = STEP.prefill_s(640) + sum(STEP.step_s(1, 640 + i) for i in range(64))
    assert times == pytest.approx([expected, expected], rel=0.01)


def test_migration_loads_the_prefix_from_the_pool_on_the_instance_s_devices():
    """A pool load costs pool_vs_prefill of recomputing the real context on the chunk's instance."""
    tp8 = STEP.parallel(8)
    inst = SimInstance("a", capacity=10_000, max_num_seqs=8, step=tp8, unit=64, pool_vs_prefill=0.09)
    seq = _seq(0, 100, 10)
    seq.migrated = True
    inst.submit(seq, 0.0)
    assert seq.load_s == pytest.approx(0.09 * tp8.prefill_s(6400))


def test_decode_time_integrates_the_growing_context():
    """Attention-heavy steps: the step time doubles and more as the context grows during the chunk.

    Pricing each interval at the context it started with (the earlier model) came out ~20% short.
    """
    step = StepModel(fixed_s=1e-3, per_token_s=0.0, per_context_s=1e-4, prefill_per_token_s=0.0)
    inst = SimInstance("a", capacity=10_000, max_num_seqs=8, step=step, unit=1)
    done = run_instance(inst, [_seq(0, 10, 100)])
    exact = sum(step.step_s(1, 10 + i) for i in range(100))  # 0.695 s
    assert done["g0-s0"] == pytest.approx(exact, rel=0.01)


def _speculating(step: StepModel, capacity: int, context: int, accept: float, **kw) -> tuple[SimInstance, list[SimSeq]]:
    """A speculating instance with four chunks of `context` at acceptance `accept`, admitted."""
    inst = SimInstance("a", capacity=capacity, max_num_seqs=8, step=step, unit=1, speculate=True, **kw)
    seqs = [_seq(i, context, 1000) for i in range(4)]
    for s in seqs:
        s.accept = accept
        inst.submit(s, 0.0)
    inst.settle()
    return inst, seqs


def test_speculative_step_pays_its_drafting_time():
    step = StepModel(fixed_s=1e-4, per_token_s=1e-6, per_context_s=0.0, prefill_per_token_s=0.0)
    inst, seqs = _speculating(step, 10_000, 10, 0.6)
    drafted = sum(_draft_len(s) for s in seqs)
    assert drafted > 0
    positions = sum(_draft_len(s) + 1 for s in seqs)
    assert inst._step_s == pytest.approx(step.step_s(positions, 40) + drafted * DRAFT_US_PER_TOKEN, rel=1e-9)


def test_speculative_step_pays_what_its_spec_cost_says_verifying_adds():
    from seer.sim.speculation import SpecCost

    step = StepModel(fixed_s=1e-4, per_token_s=1e-6, per_context_s=0.0, prefill_per_token_s=0.0)
    assert SpecCost.roofline().extra_s(step, 12) == 0.0  # the paper's: a drafted position is a position
    cost = SpecCost(verify_token=0.02, spec_fixed=0.1, zero_draft=0.05)
    inst, seqs = _speculating(step, 10_000, 10, 0.6, spec_cost=cost)
    drafted = sum(_draft_len(s) for s in seqs)
    assert drafted > 0
    positions = sum(_draft_len(s) + 1 for s in seqs)
    extra = step.fixed_s * (0.05 + 0.1) + drafted * (0.02 * step.fixed_s - step.per_token_s)
    assert inst._step_s == pytest.approx(step.step_s(positions, 40) + drafted * DRAFT_US_PER_TOKEN + extra, rel=1e-9)
    # a drafted token as dear as a third of the step: Algorithm 1 drafts nothing, the step still
    # pays the speculating instance's own cost
    inst, seqs = _speculating(step, 10_000, 10, 0.6, spec_cost=SpecCost(verify_token=0.34, zero_draft=0.05))
    assert all(_draft_len(s) == 0 for s in seqs)
    assert inst._step_s == pytest.approx(step.step_s(4, 40) + 0.05 * step.fixed_s, rel=1e-9)


def test_the_measured_spec_cost_is_the_recorded_breakdowns_fit():
    from seer.sim.speculation import SpecCost, fit_breakdown

    path = "bench/results/spec_breakdown/spec_breakdown_fixed.json"
    f, c, sf, v, z = fit_breakdown(path)
    assert 5e-3 < f < 12e-3 and 0.1e-3 < c < 0.3e-3  # ~8 ms fixed, ~0.2 ms per verified token
    cost = SpecCost.measured(path)
    assert cost.verify_token == pytest.approx((c + v) / f) and cost.spec_fixed == pytest.approx(sf / f)
    assert cost.zero_draft == pytest.approx(z / f)


def _draft_len(seq: SimSeq) -> int:
    """The draft length behind a speculating request's rate (1 - a^(g+1)) / (1 - a)."""
    return next(g for g in range(9) if tokens_per_step(seq.accept, g) == pytest.approx(seq.rate))


def test_acceptance_rate_inverts_the_expected_tokens_per_step():
    for length in (1.2, 1.7, 2.53):
        a = accept_rate_for_length(length, 8)
        assert tokens_per_step(a, 8) == pytest.approx(length, rel=1e-4)
    t = AcceptanceTable.paper()
    assert t.accept_rate(0) < t.accept_rate(1) < t.accept_rate(5) < t.accept_rate(20)


# -- data-parallel attention (Kimi-K2's DP32/EP32): one KV pool per rank, lock-step ranks ---------

def test_dp_rank_that_is_full_preempts_while_the_other_ranks_have_room():
    """Two ranks of 100 slots: the balancer alternates arrivals, so rank 0 gets the two long
    requests and runs out of KV (and preempts) while rank 1, with two short ones, has room: the
    instance as a whole never held more than 80% of its 200 slots. One pool of 200 never preempts."""
    seqs = [_seq(0, 10, 60), _seq(1, 10, 5), _seq(2, 10, 60), _seq(3, 10, 5)]
    dp = SimInstance("a", capacity=200, max_num_seqs=8, step=STEP, unit=1, ranks=2)
    peak = []
    for s in seqs:
        dp.submit(s, 0.0)
    while dp.running or dp.waiting:
        t = dp.next_event()
        assert t < math.inf
        before = dp.pools[0].preemptions
        dp.on_event(t)
        if dp.pools[0].preemptions > before:
            peak.append(dp.used + sum(s.context for s in dp.pools[0].waiting if s.preempted))
    assert [s.rank for s in seqs] == [0, 1, 0, 1]
    assert dp.pools[0].preemptions >= 1 and dp.pools[1].preemptions == 0
    assert seqs[2].preempted >= 1 and seqs[0].preempted == 0  # FCFS victim within its rank
    assert peak and max(peak) <= 0.8 * dp.capacity  # the instance had room; the rank did not
    assert all(s.made == pytest.approx(s.goal) for s in seqs)
    one = SimInstance("b", capacity=200, max_num_seqs=8, step=STEP, unit=1)
    run_instance(one, [_seq(0, 10, 60), _seq(1, 10, 5), _seq(2, 10, 60), _seq(3, 10, 5)])
    assert one.preemptions == 0


def test_dp_balancer_routes_by_waiting_and_running_and_a_moved_chunk_loads_its_prefix():
    dp = SimInstance("a", capacity=10_000, max_num_seqs=1, step=STEP, unit=1, ranks=3)
    first = [_seq(i, 10, 5) for i in range(3)]
    for s in first:
        dp.submit(s, 0.0)
    assert [s.rank for s in first] == [0, 1, 2]
    extra = _seq(3, 10, 5)
    dp.submit(extra, 0.0)  # all three have one waiting: score 4 each, the lowest rank on ties
    assert extra.rank == 0
    dp.settle()  # max_num_seqs 1 per rank: one runs on each, rank 0 keeps one waiting (score 1 + 4)
    nxt = _seq(4, 10, 5)
    dp.submit(nxt, 0.0)
    assert nxt.rank == 1 and len(dp.running) == 3
    assert dp.pool_loads == 0 and nxt.load_s == 0.0
    # The same request's next chunk, routed to another rank than its first: it loads its prefix.
    again = _seq(0, 15, 5)
    dp.submit(again, 0.0)
    assert again.rank == 2 and dp.pool_loads == 1
    assert again.load_s == pytest.approx(dp.pool_vs_prefill * dp._prefill_parts(15)[0])


def test_dp_step_costs_the_slowest_rank():
    """Attention-only step model: one rank with 1000 context tokens and one with 10 step at the
    pace of the first (twice the balanced cost of 1010 tokens over two GPUs)."""
    attn = StepModel(fixed_s=1e-3, per_token_s=0.0, per_context_s=1e-6, prefill_per_token_s=0.0)
    inst_step = attn.parallel(2)  # the instance's model: a balanced batch over its two GPUs
    dp = SimInstance("a", capacity=10_000, max_num_seqs=8, step=inst_step, unit=1, ranks=2)
    pooled = SimInstance("b", capacity=10_000, max_num_seqs=8, step=inst_step, unit=1)
    for inst in (dp, pooled):
        inst.submit(_seq(0, 1000, 50), 0.0)
        inst.submit(_seq(1, 10, 50), 0.0)
        inst.settle()
    assert dp._step_s == pytest.approx(attn.step_s(0, 1000))
    assert pooled._step_s == pytest.approx(inst_step.step_s(0, 1010))
    assert dp._step_s > 1.9 * pooled._step_s - attn.fixed_s


def test_dp_step_splits_position_compute_into_the_rank_s_share_and_the_experts():
    comp = StepModel(fixed_s=0.0, per_token_s=1e-4, per_context_s=0.0, prefill_per_token_s=0.0)
    dp = SimInstance("a", capacity=10_000, max_num_seqs=8, step=comp, unit=1, ranks=2, local_share=0.25)
    for i in range(4):  # the balancer alternates: [0, 2 | 1, 3]
        dp.submit(_seq(i, 10, 50), 0.0)
    dp.pools[1].waiting.popleft()  # make it uneven by hand: [0, 2, 9 | 3]
    dp.pools[0].waiting.append(_seq(9, 10, 50))
    dp.settle()
    r0, r1 = (len(p.running) for p in dp.pools)
    assert (r0, r1) == (3, 1)
    # experts: 0.75 x per_token x all 4 positions; the rank's own 0.25 at 2 ranks' GPUs' worth for the slowest.
    assert dp._step_s == pytest.approx(0.75 * 1e-4 * 4 + 0.25 * 2 * 1e-4 * 3)


def test_dp_prefills_on_different_ranks_overlap_but_stall_every_rank():
    pre = StepModel(fixed_s=1e-3, per_token_s=0.0, per_context_s=0.0, prefill_per_token_s=1e-3)
    dp = SimInstance("a", capacity=10_000, max_num_seqs=8, step=pre, unit=1, ranks=2, local_share=1.0)
    one = SimInstance("b", capacity=10_000, max_num_seqs=8, step=pre, unit=1)
    for inst in (dp, one):
        for i in range(2):
            s = _seq(i, 100, 5)
            s.prefill = 100
            inst.submit(s, 0.0)
        inst.settle()
    # Each rank prefills its own 100 tokens at 2 GPUs' worth of the instance rate, at the same time.
    assert dp.stall_until == pytest.approx(2 * pre.prefill_s(100))
    assert one.stall_until == pytest.approx(2 * pre.prefill_s(100))  # one engine: one after the other
    assert all(s.ready_at == pytest.approx(dp.stall_until) for s in dp.running)  # lock-step: all wait


def test_dp_workload_runs_end_to_end_with_per_rank_pools():
    w = tiny_workload(instances=1, groups=4, group_size=4, kv_capacity_tokens=800, dp_ranks=4, chunk_size=64)
    hidden = {(g, k): 40 + 60 * ((g + k) % 3) for g in range(4) for k in range(4)}
    for name in ("baseline", "context"):
        st = simulate(w, BY_NAME[name], hidden, SETTINGS).stats
        assert st.output_tokens == sum(hidden.values())
        assert st.extra["dp_ranks"] == 4


# -- attention compute with several query positions (speculative verification) ------------------

def test_attention_multiplier_and_the_paper_models_ridge_points():
    from seer.sim.hardware import MODELS, attention_ridge_positions
    from seer.sim.speculation import attention_multiplier
    assert attention_multiplier(1, 2.5) == 1.0 and attention_multiplier(2, 2.5) == 1.0
    assert attention_multiplier(9, 2.5) == pytest.approx(3.6)
    assert attention_multiplier(9, math.inf) == 1.0
    # FlashMLA's analysis: MLA decode does ~2 x heads FLOPs per KV byte per query position, so on an
    # H800 (989 TFLOPS BF16 / 3.35 TB/s) Kimi-K2's 64 heads are compute-bound from ~2.4 positions,
    # Moonlight's 16 heads stay memory-bound up to 9 (8 drafts + 1); Qwen2-VL-72B's GQA (64 query
    # heads over 8 KV heads: 8 FLOPs per byte) never is at these draft lengths.
    assert 2.0 < attention_ridge_positions(MODELS["kimik2"]) < 3.0
    assert 9.0 < attention_ridge_positions(MODELS["moonlight"]) < 10.5
    assert attention_ridge_positions(MODELS["qwen2vl72b"]) > 30


def test_speculative_step_pays_compute_bound_attention():
    step = StepModel(fixed_s=1e-4, per_token_s=1e-6, per_context_s=1e-7, prefill_per_token_s=0.0)
    from seer.sim.speculation import attention_multiplier
    for ridge in (math.inf, 2.0):
        inst, seqs = _speculating(step, 100_000, 1000, 0.7, ridge_positions=ridge)
        drafted = sum(_draft_len(s) for s in seqs)
        positions = sum(_draft_len(s) + 1 for s in seqs)
        attn_ctx = sum(s.context * attention_multiplier(_draft_len(s) + 1, ridge) for s in seqs)
        assert inst._step_s == pytest.approx(step.step_s(positions, attn_ctx) + drafted * DRAFT_US_PER_TOKEN, rel=1e-9)
        if ridge == math.inf:
            free_drafts = drafted
    assert 0 < drafted < free_drafts  # Algorithm 1 drafts less when verification attention costs more


# -- whole simulated iterations -------------------------------------------------------------------

def test_idle_fraction_and_tail_on_a_hand_made_imbalance():
    """Baseline: group 0 (long) on inst0, group 1 (short) on inst1: inst1 idles most of the iteration."""
    w = tiny_workload()
    hidden = {(0, 0): 900, (0, 1): 900, (1, 0): 90, (1, 1): 90}
    run = simulate(w, BY_NAME["baseline"], hidden, SETTINGS)
    st = run.stats
    busy = {i.name: i for i in st.instances}
    assert busy["inst0"].idle_fraction < 0.02
    assert 0.8 < busy["inst1"].idle_fraction < 0.95
    assert st.output_tokens == 1980
    # 4 requests: the tail is the last one's finish minus the third's (both long ones finish together).
    assert st.tail_s == pytest.approx(0.0, abs=1e-6)
    ctx = simulate(w, BY_NAME["context"], hidden, SETTINGS).stats
    assert ctx.wall_s < st.wall_s  # the long group is split over both instances


def test_only_the_oracle_gets_the_lengths_and_it_orders_by_them():
    w = tiny_workload(groups=4, group_size=2, instances=1, max_num_seqs=1)
    hidden = {(g, k): 50 + 10 * g + k for g in range(4) for k in range(2)}
    wrong = {key: 1000 - v for key, v in hidden.items()}  # reversed ranking
    right_run = simulate(w, BY_NAME["oracle"], hidden, SETTINGS)
    wrong_run = simulate(w, BY_NAME["oracle"], hidden, SETTINGS, oracle_lengths=wrong)
    assert right_run.first_dispatch[0] == "g3-s1"  # the longest true length goes first
    assert wrong_run.first_dispatch[0] == "g0-s0"  # the oracle follows its table, nothing else
    for name in ("baseline", "divided", "context"):
        a = simulate(w, BY_NAME[name], hidden, SETTINGS)
        b = simulate(w, BY_NAME[name], hidden, SETTINGS, oracle_lengths=wrong)
        assert a.first_dispatch == b.first_dispatch and a.stats.wall_s == b.stats.wall_s


def test_longest_requests_queueing_time():
    """One slot: FIFO makes the longest request (last in order) wait for every first chunk ahead of it;
    longest-first never makes it wait, so the diagnostic reads 0."""
    w = tiny_workload(instances=1, max_num_seqs=1, chunk_size=64)
    hidden = {(0, 0): 10, (0, 1): 12, (1, 0): 14, (1, 1): 14 * 64}  # the longest always has the most left
    fifo = simulate(w, BY_NAME["divided"], hidden, SETTINGS).stats.extra["longest_queued_s"]
    oracle = simulate(w, BY_NAME["oracle"], hidden, SETTINGS).stats.extra["longest_queued_s"]
    assert oracle == pytest.approx(0.0, abs=1e-9)
    others = sum(STEP.step_s(1, 10 + i) for i in range(10 + 12 + 14))  # their decoding alone
    assert fifo > others


def test_ladder_order_on_a_paper_scenario_at_small_scale():
    """The ladder on a small Moonlight: each step at least the previous one, and the oracle at
    least context-aware scheduling (deterministic: the sim has no noise)."""
    w = PAPER_WORKLOADS["moonlight"].scaled(0.125)
    hidden = w.hidden_lengths(0)
    tps = {c.name: simulate(w, c, hidden, SETTINGS).stats.tokens_per_s for c in LADDER}
    assert tps["baseline"] < tps["divided"] <= tps["context"] < tps["grouped_sd"]
    assert tps["oracle"] >= tps["context"]


@pytest.mark.parametrize("seed", [0, 1])
def test_length_context_removes_divided_rollouts_straggler_tail(seed):
    """With lengths a group's probe predicts exactly (ICC 1), context-aware scheduling removes the
    straggler tail that divided rollout (requests in arrival order) leaves, and gains throughput by
    it. Divided rollout's other reading, a request back from a chunk to the end of the queue
    (processor sharing), lies between the two: docs/bench.md, "Current result", change 4."""
    w = replace(PAPER_WORKLOADS["moonlight"], icc=1.0).scaled(0.125)
    hidden = w.hidden_lengths(seed)
    configs = {c.name: c for c in LADDER} | {"requeue": select("divided+continuations_first=false")[0]}
    st = {n: simulate(w, configs[n], hidden, SETTINGS, seed).stats for n in ("divided", "requeue", "context", "oracle")}
    assert st["context"].tail_s < 0.3 * st["divided"].tail_s
    assert st["context"].tokens_per_s > 1.02 * st["divided"].tokens_per_s
    assert st["divided"].tokens_per_s < st["requeue"].tokens_per_s <= st["context"].tokens_per_s
    assert st["oracle"].tokens_per_s >= st["context"].tokens_per_s
    for s in st.values():  # the batch is bound by the KV booking, never by the memory held
        assert s.extra["mean_kv_used"] < 0.8


def test_select_configs():
    assert [c.name for c in select("context,baseline")] == ["baseline", "context"]
    with pytest.raises(ValueError):
        select("nope")


# -- the roofline step model for the paper's clusters ---------------------------------------------

def test_roofline_kv_layouts_and_costs():
    from seer.sim.hardware import H800, MODELS, roofline
    assert MODELS["moonlight"].kv_bytes_per_token == 27 * 576 * 2  # MLA: latent 512 + rope 64, bf16
    assert MODELS["qwen2vl72b"].kv_bytes_per_token == 80 * 2 * 8 * 128 * 2  # GQA: K and V, 8 heads of 128
    one = roofline(MODELS["qwen2vl72b"], 1)
    tp8 = roofline(MODELS["qwen2vl72b"], 8)
    assert one.fixed_s == pytest.approx(72.7e9 * 2 / H800.hbm_bytes_per_s)  # all bf16 weights read per step
    for a, b in ((one.fixed_s, tp8.fixed_s), (one.per_token_s, tp8.per_token_s), (one.per_context_s, tp8.per_context_s)):
        assert b == pytest.approx(a / 8)  # unlike StepModel.parallel, the weight read splits too
    # Kimi-K2's FP8 weights: half the bytes per parameter and FP8 FLOPS
    k = roofline(MODELS["kimik2"], 32)
    assert k.fixed_s == pytest.approx(1.04e12 / 32 / H800.hbm_bytes_per_s)
    assert k.per_token_s == pytest.approx(2 * 32e9 / (32 * H800.flops["fp8"]))


def test_roofline_reads_only_the_routed_experts_a_small_batch_touches():
    """Moonlight on one GPU: a step reads the experts its positions were routed to (6 of 64 each,
    uniformly), so a 15-chunk batch reads ~3/4 of them and its 9-position verification all."""
    from seer.sim.hardware import H800, MODELS, roofline
    m = roofline(MODELS["moonlight"], 1)
    assert m.fixed_s + m.experts_s == pytest.approx(MODELS["moonlight"].weight_bytes / H800.hbm_bytes_per_s)
    assert m.experts_read_s(15) == pytest.approx(m.experts_s * (1 - (58 / 64) ** 15))
    assert m.experts_read_s(135) > 0.999 * m.experts_s
    assert m.step_s(1, 0) < m.step_s(15, 0) < m.step_s(135, 0)
    assert m.parallel(1).experts_s == m.experts_s  # kept through the instance's spread
    # dense, and expert-parallel (the instance's ~300 positions touch every expert): no such term
    assert roofline(MODELS["qwen2vl72b"], 8).experts_s == 0
    assert roofline(MODELS["kimik2"], 32, dp_ranks=32).experts_s == 0


def test_expert_parallel_alltoall_is_deepeps_h800_latency_per_token():
    from seer.sim.hardware import MODELS, alltoall_per_position_s
    # DeepEP low-latency kernels, EP32 on H800: dispatch 155 us + combine 273 us for 128 tokens, 60 MoE layers
    assert alltoall_per_position_s(MODELS["kimik2"], 32) == pytest.approx(60 * (155e-6 + 273e-6) / 128)
    assert alltoall_per_position_s(MODELS["kimik2"], 20) == alltoall_per_position_s(MODELS["kimik2"], 32)
    assert alltoall_per_position_s(MODELS["moonlight"], 1) == 0.0
    w = PAPER_WORKLOADS["kimik2"]
    assert SimSettings.alltoall_per_position(w) == alltoall_per_position_s(MODELS["kimik2"], 32)
    assert SimSettings.alltoall_per_position(PAPER_WORKLOADS["qwen2vl72b"]) == 0.0


def test_dp_step_pays_the_alltoall_of_the_busiest_ranks_positions():
    none = StepModel(fixed_s=1e-3, per_token_s=0.0, per_context_s=0.0, prefill_per_token_s=0.0)
    a2a = 1e-4
    dp = SimInstance("a", capacity=10_000, max_num_seqs=8, step=none, unit=1, ranks=2, alltoall_per_position_s=a2a)
    for i in range(3):  # the balancer alternates: [0, 2 | 1]
        dp.submit(_seq(i, 10, 50), 0.0)
    dp.settle()
    assert dp._step_s == pytest.approx(1e-3 + 2 * a2a)


def test_weights_per_gpu_under_dp_attention():
    from seer.sim.hardware import MODELS, weight_bytes_per_gpu
    k = MODELS["kimik2"]
    # every rank holds the 11.56B non-expert parameters, plus 1/32 of the routed experts (FP8)
    assert weight_bytes_per_gpu(k, 32, dp_ranks=32) == pytest.approx(11.56e9 + (1.04e12 - 11.56e9) / 32)
    assert weight_bytes_per_gpu(k, 32) == pytest.approx(1.04e12 / 32)
    q = MODELS["qwen2vl72b"]
    assert weight_bytes_per_gpu(q, 8) == pytest.approx(72.7e9 * 2 / 8)


def test_workload_kv_capacities_follow_the_calibration_and_the_stated_assumptions():
    """Qwen2-VL-72B's KV is the calibrated value (bench/results/sim/sim_calibration.json); Moonlight's
    is what the same share of GPU memory leaves; Kimi-K2's what vLLM's default 0.9 leaves on each
    of its 32 DP ranks (the calibrated share cannot hold its weights)."""
    import json
    from pathlib import Path
    from seer.sim.hardware import MODELS, kv_capacity_tokens, memory_fraction_for
    from seer.sim.workloads import KIMI_K2_MEMORY_FRACTION, QWEN2VL72B_KV_CALIBRATED, ROLLOUT_MEMORY_FRACTION
    cal = json.loads((Path(__file__).resolve().parents[2] / "bench/results/sim/sim_calibration.json").read_text())
    assert cal["target"]["baseline_preemptions_per_iteration"] == 13_686
    assert QWEN2VL72B_KV_CALIBRATED == cal["kv_capacity_tokens"] == PAPER_WORKLOADS["qwen2vl72b"].kv_capacity_tokens
    assert abs(cal["baseline_mean_preemptions"] - 13_686) / 13_686 < 0.05
    assert ROLLOUT_MEMORY_FRACTION == pytest.approx(memory_fraction_for(MODELS["qwen2vl72b"], 8, QWEN2VL72B_KV_CALIBRATED))
    assert PAPER_WORKLOADS["moonlight"].kv_capacity_tokens == kv_capacity_tokens(MODELS["moonlight"], 1, ROLLOUT_MEMORY_FRACTION)
    k = PAPER_WORKLOADS["kimik2"]
    assert k.dp_ranks == 32 and k.kv_capacity_tokens == kv_capacity_tokens(MODELS["kimik2"], 32, KIMI_K2_MEMORY_FRACTION, 32)
    try:  # the calibrated share leaves Kimi-K2's ranks no room for even one longest request
        per_rank = kv_capacity_tokens(MODELS["kimik2"], 32, ROLLOUT_MEMORY_FRACTION, 32) / 32
    except ValueError:
        per_rank = 0
    assert per_rank < k.max_tokens + k.prompt_tokens
    for w in PAPER_WORKLOADS.values():  # a longest request fits in one pool (vLLM refuses to start otherwise)
        assert w.kv_capacity_tokens / w.dp_ranks > w.max_tokens + w.prompt_tokens


def test_calibrated_qwen_baseline_preempts_about_as_often_as_the_paper_reports():
    """A quarter of the cluster (4 instances), one seed: per full-scale iteration within 25% of 13,686."""
    w = PAPER_WORKLOADS["qwen2vl72b"].scaled(0.25)
    st = simulate(w, BY_NAME["baseline"], w.hidden_lengths(0), SETTINGS_MEASURED()).stats
    assert abs(st.preemptions / w.paper_scale - 13_686) / 13_686 < 0.25


def SETTINGS_MEASURED() -> SimSettings:
    from seer.sim.step_model import load
    return SimSettings(load().model, AcceptanceTable.paper())


def test_roofline_settings_replace_the_measured_model_per_workload():
    w = PAPER_WORKLOADS["qwen2vl72b"]
    measured = SimSettings(STEP, AcceptanceTable.paper()).instance_step(w)
    assert measured == STEP.parallel(8)
    from seer.sim.hardware import H800, MODELS, roofline, weight_bytes_per_gpu
    assert SimSettings(STEP, AcceptanceTable.paper(), roofline=True).instance_step(w) == roofline(MODELS["qwen2vl72b"], 8)
    k = SimSettings(STEP, AcceptanceTable.paper(), roofline=True).instance_step(PAPER_WORKLOADS["kimik2"])
    # DP attention: each GPU reads its replicated non-expert weights and its share of the experts every step
    assert k.fixed_s == pytest.approx(weight_bytes_per_gpu(MODELS["kimik2"], 32, 32) / H800.hbm_bytes_per_s)


def test_sched_overrides_reach_the_policy_and_early_packing_admits_more():
    """`python -m bench.sim --sched early_packing=true`: the option reaches the context policy (its
    first chunks book only their prompt, so more start at once) and leaves divided rollout alone;
    fields the simulator derives from the workload are refused."""
    from bench.sim.run import parse_scheduler
    assert parse_scheduler(["early_packing=true", "starvation_every=8"]) == (("early_packing", True),
                                                                             ("starvation_every", 8))
    for bad in ("chunk_size=4096", "early_packing=maybe", "nope=1"):
        with pytest.raises(SystemExit):
            parse_scheduler([bad])
    w = tiny_workload(instances=1, groups=4, group_size=2, kv_capacity_tokens=200, chunk_size=64)
    hidden = {(g, k): 40 + 5 * g + k for g in range(4) for k in range(2)}
    packed = replace(SETTINGS, scheduler=(("early_packing", True),))
    off = simulate(w, BY_NAME["context"], hidden, SETTINGS).stats
    on = simulate(w, BY_NAME["context"], hidden, packed).stats
    # the same option set on the configuration (`context+early_packing=true`) gives the same run
    (variant,) = [c for c in select("context+early_packing=true") if c.sched]
    assert simulate(w, variant, hidden, SETTINGS).stats.extra["mean_running"] == on.extra["mean_running"]
    assert on.extra["mean_running"] > off.extra["mean_running"]
    a = simulate(w, BY_NAME["divided"], hidden, SETTINGS).stats
    b = simulate(w, BY_NAME["divided"], hidden, packed).stats
    assert a.wall_s == b.wall_s and a.extra["mean_running"] == b.extra["mean_running"]


def test_engine_priority_reaches_the_modelled_engines(monkeypatch):
    """`--sched engine_priority=true`: the context policy's chunk priorities (minus the tokens
    generated) reach the instances, which then schedule by priority; without it every chunk is
    priority 0 on FCFS instances."""
    seen = []
    submit = SimInstance.submit

    def spy(self, seq, now):
        seen.append((self.priority_scheduling, seq.priority, seq.ticket.request.generated))
        submit(self, seq, now)

    monkeypatch.setattr(SimInstance, "submit", spy)
    w = tiny_workload(instances=1, groups=4, group_size=2, kv_capacity_tokens=200, chunk_size=16)
    hidden = {(g, k): 40 + 5 * g + k for g in range(4) for k in range(2)}
    ranked = replace(SETTINGS, scheduler=(("early_packing", True), ("engine_priority", True)))
    simulate(w, BY_NAME["context"], hidden, ranked)
    assert all(on and p == -gen for on, p, gen in seen) and min(p for _, p, _ in seen) < 0
    seen.clear()
    simulate(w, BY_NAME["context"], hidden, SETTINGS)
    assert seen and all(not on and p == 0 for on, p, _ in seen)
