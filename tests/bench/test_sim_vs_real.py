"""A simulated run and a real run of the same small trace-driven workload rank the configurations alike.

Real: two vLLM instances of the tiny model (one core each), hidden lengths enforced by
bench.trace_backend, each configuration once. Simulated: the same workload, lengths
and policies through bench.sim with the step model fitted from bench/sim/step_times.json. Only
pairs the simulator separates clearly (> 20%) are compared, so machine noise on a shared box
cannot flip a near-tie.
"""

import asyncio
import os
from dataclasses import replace

import pytest

from bench.compare import CompareSettings, run_one
from bench.configs import BY_NAME
from bench.sim.simulate import SimSettings, simulate
from bench.sim.speculation import AcceptanceTable
from bench.sim.step_model import load
from bench.trace_backend import TraceBackend
from bench.workloads import Workload

CONFIGS = ("baseline", "divided", "context", "oracle")

# Two long groups that group round-robin puts on the same instance (groups 0 and 2 -> inst0) and two
# short ones (-> inst1): the imbalance divided rollout removes. KV is ample (no preemption), so
# the order is decided by balance alone, which both the model and the machine must show.
# Batches must be large enough for the per-token cost to matter: on a latency-bound instance
# balance does not change the wall time, in the model or for real.
G = 32
HIDDEN = {(g, k): (560 + (37 * k) % 120 if g % 2 == 0 else 30 + (13 * k) % 40) for g in range(4) for k in range(G)}

WORKLOAD = Workload(
    "test", instances=2, groups=4, group_size=G, max_tokens=1024, mean_tokens=330, prompt_tokens=30,
    kv_capacity_tokens=131072, max_num_seqs=128, chunk_size=128,
)


def _sim_ranking(hidden, prompt_tokens):
    fit = load()
    w = replace(WORKLOAD, prompt_tokens=prompt_tokens)
    settings = SimSettings(fit.model, AcceptanceTable.paper())
    return {c: simulate(w, BY_NAME[c], hidden, settings).stats.tokens_per_s for c in CONFIGS}


@pytest.mark.vllm
@pytest.mark.timeout(300)
@pytest.mark.xfail(strict=True, reason=(
    "known gap: on this machine every chunk costs a re-admission (HTTP round trip through the API "
    "server sharing the instance's core, new request in vLLM) that the simulator does not model, so "
    "real chunked configurations run ~2x slower than group round-robin where the simulator predicts "
    "~1.37x faster (measured: baseline 6289 tok/s, divided 2832). strict: an XPASS means the gap closed."))
def test_simulated_and_real_runs_agree_on_the_order(bench_model, tmp_path):
    tiny_model = bench_model
    from seer.rollout.instance import InstanceSpec, cpu_sets, free_port
    from seer.rollout.pool import InstancePool

    s = CompareSettings(mode="trace", model=str(tiny_model), groups=WORKLOAD.groups, group_size=WORKLOAD.group_size,
                        max_tokens=WORKLOAD.max_tokens, mean_tokens=WORKLOAD.mean_tokens, chunk_size=WORKLOAD.chunk_size,
                        max_num_seqs=WORKLOAD.max_num_seqs, seed=3)
    from bench.compare import _prompts

    prompts = _prompts(s, tiny_model)
    hidden = HIDDEN
    prompt_lens = {g: len(p.prompt_ids) for g, p in enumerate(prompts)}
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    # 512 B of KV per token for the tiny model: 64 MiB = 131072 slots, what WORKLOAD.kv_capacity_tokens says.
    specs = [InstanceSpec(f"inst{i}", str(tiny_model), free_port(), cpus=c, max_model_len=2048,
                          kv_cache_bytes=64 << 20, max_num_seqs=128, seed=3, weight_sync=False,
                          env={"VLLM_SERVER_DEV_MODE": "1"}, extra_args=("--max-num-batched-tokens", "131072"))
             for i, c in enumerate(sets)]
    with InstancePool.launch(specs, tmp_path / "logs", ready_timeout_s=240) as pool:
        async def go():
            try:
                backends = [TraceBackend(c, hidden, prompt_lens) for c in pool.clients]
                await run_one(backends, pool.clients, BY_NAME["divided"], prompts, s, "warm-")
                out = {}
                for name in CONFIGS:
                    stats, _, lengths = await run_one(backends, pool.clients, BY_NAME[name], prompts, s,
                                                      f"{name}-", hidden)
                    assert lengths == hidden  # every request ended exactly at its hidden length
                    out[name] = stats
                return out
            finally:
                await pool.aclose_clients()

        real = asyncio.run(go())
    mean_prompt = sum(prompt_lens.values()) // len(prompt_lens)
    sim = _sim_ranking(hidden, mean_prompt)
    real_tps = {c: real[c].tokens_per_s for c in CONFIGS}
    checked = 0
    for a in CONFIGS:
        for b in CONFIGS:
            if sim[a] > 1.2 * sim[b]:
                checked += 1
                assert real_tps[a] > real_tps[b], f"sim says {a} > {b} ({sim}), real says {real_tps}"
    assert checked >= 1, f"the simulator separates no pair clearly: {sim}"
