"""The simulator's parts: step-time fit, lengths, the modelled vLLM instance, metrics, the oracle's input."""

import math
from dataclasses import replace

import numpy as np
import pytest

from bench.configs import BY_NAME, LADDER, select
from bench.sim.instance import SimInstance, SimSeq
from bench.sim.simulate import SimSettings, pool_load_s, simulate
from bench.sim.speculation import DRAFT_US_PER_TOKEN, AcceptanceTable, accept_rate_for_length
from bench.sim.step_model import StepModel, fit
from bench.workloads import PAPER_WORKLOADS, SMALL, LengthModel, Workload
from seer.dgds.draft_length import tokens_per_step
from seer.rollout.types import GenerateRequest, PromptSpec, SamplingParams
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
    assert pool_load_s(tp8, 100, 64, 0.09) == pytest.approx(0.09 * tp8.prefill_s(6400))


def test_decode_time_integrates_the_growing_context():
    """Attention-heavy steps: the step time doubles and more as the context grows during the chunk.

    Pricing each interval at the context it started with (the earlier model) came out ~20% short.
    """
    step = StepModel(fixed_s=1e-3, per_token_s=0.0, per_context_s=1e-4, prefill_per_token_s=0.0)
    inst = SimInstance("a", capacity=10_000, max_num_seqs=8, step=step, unit=1)
    done = run_instance(inst, [_seq(0, 10, 100)])
    exact = sum(step.step_s(1, 10 + i) for i in range(100))  # 0.695 s
    assert done["g0-s0"] == pytest.approx(exact, rel=0.01)


def test_speculative_step_pays_its_drafting_time():
    step = StepModel(fixed_s=1e-4, per_token_s=1e-6, per_context_s=0.0, prefill_per_token_s=0.0)
    inst = SimInstance("a", capacity=10_000, max_num_seqs=8, step=step, unit=1, speculate=True)
    seqs = [_seq(i, 10, 1000) for i in range(4)]
    for s in seqs:
        s.accept = 0.6
        inst.submit(s, 0.0)
    inst.settle()
    drafted = sum(_draft_len(s) for s in seqs)
    assert drafted > 0
    positions = sum(_draft_len(s) + 1 for s in seqs)
    assert inst._step_s == pytest.approx(step.step_s(positions, 40) + drafted * DRAFT_US_PER_TOKEN, rel=1e-9)


def _draft_len(seq: SimSeq) -> int:
    """The draft length behind a speculating request's rate (1 - a^(g+1)) / (1 - a)."""
    return next(g for g in range(9) if tokens_per_step(seq.accept, g) == pytest.approx(seq.rate))


def test_acceptance_rate_inverts_the_expected_tokens_per_step():
    for length in (1.2, 1.7, 2.53):
        a = accept_rate_for_length(length, 8)
        assert tokens_per_step(a, 8) == pytest.approx(length, rel=1e-4)
    t = AcceptanceTable.paper()
    assert t.accept_rate(0) < t.accept_rate(1) < t.accept_rate(5) < t.accept_rate(20)


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
    w = PAPER_WORKLOADS["moonlight"].scaled(0.125)
    hidden = w.hidden_lengths(0)
    tps = {c.name: simulate(w, c, hidden, SETTINGS).stats.tokens_per_s for c in LADDER}
    assert tps["baseline"] < tps["divided"] <= tps["context"] * 1.02 < tps["grouped_sd"]
    assert tps["oracle"] >= 0.95 * tps["context"]


def test_select_configs():
    assert [c.name for c in select("context,baseline")] == ["baseline", "context"]
    with pytest.raises(ValueError):
        select("nope")


# -- the roofline step model for the paper's clusters ---------------------------------------------

def test_roofline_kv_layouts_and_costs():
    from bench.sim.hardware import H800, MODELS, roofline
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


@pytest.mark.parametrize("name", list(PAPER_WORKLOADS))
def test_workload_kv_capacity_matches_the_model_sizes(name):
    """The scenarios' KV per instance is what 90% of the GPUs' 80 GB leaves after the weights (within 10%)."""
    from bench.sim.hardware import MODELS
    w, m = PAPER_WORKLOADS[name], MODELS[name]
    left = 0.9 * 80e9 * w.gpus_per_instance - m.weight_bytes
    assert w.kv_capacity_tokens == pytest.approx(left / m.kv_bytes_per_token, rel=0.10)


def test_roofline_settings_replace_the_measured_model_per_workload():
    w = PAPER_WORKLOADS["qwen2vl72b"]
    measured = SimSettings(STEP, AcceptanceTable.paper()).instance_step(w)
    assert measured == STEP.parallel(8)
    from bench.sim.hardware import MODELS, roofline
    assert SimSettings(STEP, AcceptanceTable.paper(), roofline=True).instance_step(w) == roofline(MODELS["qwen2vl72b"], 8)
