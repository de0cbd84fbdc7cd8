"""A simulated run and a real run of the same small trace-driven workload rank the configurations alike.

Real: two vLLM instances of the tiny model (one core each), hidden group-correlated lengths
enforced by bench.trace_backend, each configuration once. Simulated: the same workload, lengths
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

CONFIGS = ("baseline", "context", "oracle")

WORKLOAD = Workload(
    "test", instances=2, groups=8, group_size=4, max_tokens=384, mean_tokens=110, prompt_tokens=30,
    kv_capacity_tokens=2048, max_num_seqs=64, chunk_size=64, icc=0.9,
)


def _sim_ranking(hidden, prompt_tokens):
    fit = load()
    w = replace(WORKLOAD, prompt_tokens=prompt_tokens)
    settings = SimSettings(fit.model, AcceptanceTable.paper())
    return {c: simulate(w, BY_NAME[c], hidden, settings).stats.tokens_per_s for c in CONFIGS}


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_simulated_and_real_runs_agree_on_the_order(tiny_model, tmp_path):
    from seer.rollout.instance import InstanceSpec, cpu_sets, free_port
    from seer.rollout.pool import InstancePool

    s = CompareSettings(mode="trace", model=str(tiny_model), groups=WORKLOAD.groups, group_size=WORKLOAD.group_size,
                        max_tokens=WORKLOAD.max_tokens, mean_tokens=WORKLOAD.mean_tokens, chunk_size=WORKLOAD.chunk_size,
                        max_num_seqs=WORKLOAD.max_num_seqs, seed=3)
    from bench.compare import _prompts

    prompts = _prompts(s, tiny_model)
    hidden = WORKLOAD.hidden_lengths(3)
    prompt_lens = {g: len(p.prompt_ids) for g, p in enumerate(prompts)}
    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    # 512 B of KV per token for the tiny model: 1 MiB = 2048 slots, what WORKLOAD.kv_capacity_tokens says.
    specs = [InstanceSpec(f"inst{i}", str(tiny_model), free_port(), cpus=c, max_model_len=2048,
                          kv_cache_bytes=1 << 20, max_num_seqs=64, seed=3, weight_sync=False,
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
    assert real["baseline"].preemptions > 0 or sim["baseline"] < sim["context"]
    checked = 0
    for a in CONFIGS:
        for b in CONFIGS:
            if sim[a] > 1.2 * sim[b]:
                checked += 1
                assert real_tps[a] > real_tps[b], f"sim says {a} > {b} ({sim}), real says {real_tps}"
    assert checked >= 1, f"the simulator separates no pair clearly: {sim}"
