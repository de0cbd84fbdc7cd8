"""A simulated run and a real run of the same small trace-driven workload rank the configurations alike.

Real: two vLLM instances of the tiny model (one core each), hidden lengths enforced by
bench.trace_backend, each configuration three to five times (rounds, order rotating) through
bench.compare.run_one (no KV pool: a chunk that moves recomputes its prefix). Simulated: the
same workload, lengths, prompt lengths, batch limit, KV block and policies through bench.sim, with the step model fitted from
bench/sim/step_times.json and the per-chunk cost fitted from bench/sim/chunk_costs.json
(`python -m bench.sim.measure_chunks`, docs/bench.md). Only pairs the simulator separates
clearly (> 20%) are compared, so machine noise on a shared box cannot flip a near-tie.

The workload is chosen so that the order is decided by something both worlds share on this
machine, loaded or not: the per-chunk cost. Four groups of 4 requests, 600-799 tokens each,
equally heavy, so group round-robin is as balanced as request-level placement and both
instances stay busy in every configuration; the chunked configurations cut each request into
about six 128-token chunks, each a new request to its instance, whose measured cost
(bench/sim/chunk_costs.json: 0.21 s of latency per chunk on the step model's scale) puts the
baseline 1.45x above them in the simulator (1.23x with half that cost). With 8 requests
per instance, the instance has little else to decode while a chunk is re-admitted, as in the
measurement. Without the chunk cost the simulator ties all three (so the cheap test below fails
if the cost is dropped from the model).

Why not a workload that group round-robin cannot balance (the first version of this test): on
this 2-core machine shared with other jobs, an instance that falls idle hands its core to the
other processes, and the busy instance speeds up accordingly. Measured at load average 12-13:
two long groups on one instance with max_num_seqs 16 (two waves of ~1060 steps there, the other
instance idle after its short groups) ran at 6.2 ms per step; with both instances busy at B=16
(bench.sim.measure_chunks) a step took 12-18 ms. The balance that divided rollout wins is then
worth little on the real machine, which the simulator (a core per instance) cannot know: it put
the chunked configurations 1.7x above the baseline where the real run measured 0.58-0.82x.
"""

import asyncio
import os
import statistics
import time
from dataclasses import replace

import pytest

from bench.compare import CompareSettings, _prompts, instance_specs, run_one
from bench.configs import BY_NAME, BenchConfig
from bench.sim.chunk_model import ChunkCost, load_chunk_costs
from bench.sim.simulate import SimSettings, simulate
from bench.sim.speculation import AcceptanceTable
from bench.sim.step_model import load
from bench.trace_backend import TraceBackend
from bench.workloads import Workload

# The oracle is left out: in the simulator it ties divided and context here (ordering cannot win
# on equal groups), and its runs would add a minute to the test.
CONFIGS = ("baseline", "divided", "context")
# Each configuration runs once per round; a pair's real order is the median over rounds of the
# ratio within a round. Single runs swing by +-50% on this shared machine (the baseline took
# 6.0 s in one run and 10.9 s in another at load average 15-25), and the real gap narrows under
# heavy load: at load average 34 three rounds measured baseline/context 1.40 / 0.97 / 1.15 and
# baseline/divided 1.58 / 1.36 / 1.08, where at load average 11 they were 1.49 / 1.57 / 1.57 and
# 1.17 / 1.55 / 2.05. A median of three fails on two bad rounds; this is the median of five,
# evaluated sequentially: after three rounds a pair whose rounds all agree is decided (two more
# rounds cannot move the median of five across 1), so the fourth and fifth run only when some
# pair's rounds disagree, and the verdict is the one five rounds would give. A round takes
# 40-60 s here, so five every time would push the test past 4 minutes.
# The order rotates (A B C, B C A, C A B, ...): every configuration takes every position, and no
# configuration runs twice in a row. The alternating order it replaces (A B C, C B A, A B C) ran
# the baseline at the end of round 2 and the start of round 3 back to back, so that one burst of
# load from another job could slow the baseline in two rounds of three.
MIN_ROUNDS, MAX_ROUNDS = 3, 5
SEPARATED = 1.2  # a pair counts when the simulator puts one > 20% above the other

G = 4
MAX_SEQS = 32
HIDDEN = {(g, k): 600 + (37 * k + 53 * g) % 200 for g in range(4) for k in range(G)}
BLOCK = 128  # vLLM's CPU backend allocates KV in 128-token blocks; the scheduler aligns chunks to them

WORKLOAD = Workload(
    "sim-vs-real", instances=2, groups=4, group_size=G, max_tokens=1536, mean_tokens=700, prompt_tokens=58,
    kv_capacity_tokens=131072, max_num_seqs=MAX_SEQS, chunk_size=128,
)


def sim_throughput(prompt_tokens: int, chunk_cost: ChunkCost | None = None) -> dict[str, float]:
    w = replace(WORKLOAD, prompt_tokens=prompt_tokens)
    cost = load_chunk_costs() if chunk_cost is None else chunk_cost
    settings = SimSettings(load().model, AcceptanceTable.paper(), chunk_cost=cost, kv_pool=False, block_size=BLOCK)
    return {c: simulate(w, BY_NAME[c], HIDDEN, settings).stats.tokens_per_s for c in CONFIGS}


def test_the_simulator_separates_the_baseline_from_the_chunked_configurations():
    """Cheap half of the check below (no vLLM): with the measured step and chunk costs the workload
    is one on which the simulator ranks pairs clearly, and only because of the chunk cost."""
    sim = sim_throughput(WORKLOAD.prompt_tokens)
    assert all(sim["baseline"] > SEPARATED * sim[c] for c in ("divided", "context")), sim
    free = sim_throughput(WORKLOAD.prompt_tokens, ChunkCost())
    assert max(free.values()) < 1.05 * min(free.values()), free


@pytest.mark.vllm
@pytest.mark.timeout(900)  # 352 s for three rounds at load average 34; five take ~2 minutes more
def test_simulated_and_real_runs_agree_on_the_order(tiny_model, tmp_path):
    from seer.rollout.instance import cpu_sets
    from seer.rollout.pool import InstancePool

    t0 = time.monotonic()
    s = CompareSettings(mode="trace", model=str(tiny_model), groups=WORKLOAD.groups, group_size=WORKLOAD.group_size,
                        max_tokens=WORKLOAD.max_tokens, mean_tokens=WORKLOAD.mean_tokens, chunk_size=WORKLOAD.chunk_size,
                        max_num_seqs=MAX_SEQS, seed=3)
    prompts = _prompts(s, tiny_model)
    prompt_lens = {g: len(p.prompt_ids) for g, p in enumerate(prompts)}
    mean_prompt = round(sum(prompt_lens.values()) / len(prompt_lens))
    sim = sim_throughput(mean_prompt)
    pairs = [(a, b) for a in CONFIGS for b in CONFIGS if sim[a] > SEPARATED * sim[b]]

    def decided(rounds) -> bool:
        # the median of MAX_ROUNDS ratios is > 1 iff a majority of them is: decided once either
        # side of every pair holds a majority of MAX_ROUNDS
        need = MAX_ROUNDS // 2 + 1
        above = [sum(r[a] > r[b] for r in rounds) for a, b in pairs]
        return all(n >= need or len(rounds) - n >= need for n in above)

    cores = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(2) if len(cores) >= 2 else [",".join(map(str, cores))] * 2
    # 512 B of KV per token for the tiny model: 64 MiB = 131072 slots, what WORKLOAD.kv_capacity_tokens says.
    specs = instance_specs(replace(s, kv_cache_bytes=64 << 20), tiny_model, sets)
    with InstancePool.launch(specs, tmp_path / "logs", ready_timeout_s=300) as pool:
        async def go():
            try:
                # Untimed warm-up: an instance's first requests and first continuations pay set-up costs.
                warm = {k: min(v, 200) for k, v in HIDDEN.items()}
                await run_one([TraceBackend(c, warm, prompt_lens) for c in pool.clients], pool.clients,
                              BenchConfig("warm", "divided", chunk_size=128), prompts, replace(s, max_tokens=200), "warm-")
                backends = [TraceBackend(c, HIDDEN, prompt_lens) for c in pool.clients]
                rounds = []
                for r in range(MAX_ROUNDS):
                    if r >= MIN_ROUNDS and decided(rounds):
                        break
                    out = {}
                    for name in CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]:
                        stats, _, lengths = await run_one(backends, pool.clients, BY_NAME[name], prompts, s,
                                                          f"r{r}-{name}-", HIDDEN)
                        assert lengths == HIDDEN  # every request ended exactly at its hidden length
                        out[name] = stats.tokens_per_s
                    rounds.append(out)
                return rounds
            finally:
                await pool.aclose_clients()

        rounds = asyncio.run(go())
    ratios = {f"{a}/{b}": [round(r[a] / r[b], 2) for r in rounds] for a, b in pairs}
    report = (f"sim tok/s {({c: round(v) for c, v in sim.items()})}, real tok/s per round "
              f"{[{c: round(v) for c, v in r.items()} for r in rounds]}, real ratios per round {ratios}, "
              f"{time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.1f}")
    print(report)
    assert pairs, f"the simulator separates no pair clearly: {report}"
    for a, b in pairs:
        # Runs next to each other share the machine's load: compare within rounds. Over the rounds
        # run this median is on the side the median of MAX_ROUNDS would be (see decided()).
        ratio = statistics.median(r[a] / r[b] for r in rounds)
        assert ratio > 1.0, f"sim says {a} > {b}, real median ratio {ratio:.2f}: {report}"
