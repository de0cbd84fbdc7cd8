"""The per-chunk cost model (seer/sim/chunk_model.py): its fit, and how the modelled instance charges it."""

import math

import pytest

from seer.sim.chunk_model import GPU_CLUSTER, ChunkCost, fit, load_chunk_costs
from seer.sim.instance import SimInstance, SimSeq
from seer.sim.simulate import SimSettings
from seer.sim.speculation import AcceptanceTable
from seer.sim.step_model import StepModel
from seer.types import GenerateRequest, SamplingParams
from seer.scheduler.buffer import Request
from seer.scheduler.dispatcher import ChunkTicket

STEP = StepModel(fixed_s=2e-3, per_token_s=1e-4, per_context_s=1e-8, prefill_per_token_s=2e-5)


def test_fit_recovers_latency_and_instance_time_on_the_step_models_scale():
    latency, instance, slowdown = 0.2, 0.004, 3.0
    runs = []
    for b in (4, 16, 48):
        base = 1.0 + 0.1 * b  # the step model's wall of the single-chunk run
        for chunks in (1.0, 3.0, 5.0, 9.0):
            wall = slowdown * (base + (chunks - 1) * (latency + b * instance))
            runs.append({"batch": b, "chunks_per_request": chunks, "wall_s": wall, "step_model_wall_s": base})
    f = fit(runs)
    assert f["latency_s"] == pytest.approx(latency, rel=1e-6)
    assert f["instance_s"] == pytest.approx(instance, rel=1e-6)
    assert all(p["slowdown"] == pytest.approx(slowdown) for p in f["per_batch"])


def test_fit_never_returns_negative_costs():
    runs = [{"batch": b, "chunks_per_request": c, "wall_s": 10.0 + c * (1.0 - 0.01 * b), "step_model_wall_s": 10.0}
            for b in (4, 48) for c in (1.0, 5.0)]
    f = fit(runs)
    assert f["latency_s"] >= 0 and f["instance_s"] >= 0


def test_the_recorded_measurement_loads():
    c = load_chunk_costs()
    assert 0 < c.latency_s < 5 and c.instance_s >= 0


def test_chunks_cost_nothing_unless_asked_and_the_gpu_cluster_bound_is_small():
    assert SimSettings(STEP, AcceptanceTable.paper()).chunk_cost == ChunkCost()
    assert GPU_CLUSTER.latency_s <= 0.1 and GPU_CLUSTER.instance_s == 0.0


def _seq(i: int, context: float, goal: int) -> SimSeq:
    req = Request(f"g{i}-s0", i, 0, [1] * int(context), 10_000, i)
    gen = GenerateRequest(f"g{i}-s0-c1", [1] * int(context), goal, SamplingParams(max_tokens=goal))
    return SimSeq(ChunkTicket(req, 1, "a", "t", goal, 0, False, 0.0, gen), float(context), goal, True, 0.0, 0.0)


def _finish_times(cost: ChunkCost, n: int) -> list[float]:
    inst = SimInstance("a", capacity=10_000, max_num_seqs=8, step=STEP, unit=1, chunk_latency_s=cost.latency_s,
                       chunk_instance_s=cost.instance_s)
    for i in range(n):
        inst.submit(_seq(i, 10, 50), 0.0)
    done = []
    while inst.running or inst.waiting:
        t = inst.next_event()
        assert t < math.inf
        done += [t for _ in inst.on_event(t)]
    return done


def test_latency_delays_each_chunk_and_instance_time_queues_chunks_admitted_together():
    free = max(_finish_times(ChunkCost(), 4))
    assert max(_finish_times(ChunkCost(latency_s=0.5), 4)) == pytest.approx(free + 0.5, rel=1e-6)
    # Four chunks admitted together: the last one decodes after all four admissions.
    assert max(_finish_times(ChunkCost(instance_s=0.1), 4)) == pytest.approx(free + 0.4, rel=1e-6)
