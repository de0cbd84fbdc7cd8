"""A simulated run and a real run of the same small trace-driven workload rank the configurations alike.

Real: two vLLM instances of the tiny model (one core each, pinned whole), hidden lengths enforced
by bench.trace_backend, each configuration three to five times (rounds, order rotating) through
bench.compare.run_one (no KV pool: a chunk that moves recomputes its prefix). Simulated: the
same workload, lengths, prompt lengths, batch limit, KV block and policies through bench.sim, with
the step model fitted from bench/sim/step_times.json and the per-chunk cost fitted from
bench/sim/chunk_costs.json (`python -m bench.sim.measure_chunks`, docs/bench.md). Only pairs the
simulator separates clearly (> 20%) are compared, so machine noise cannot flip a near-tie.

The workload is the imbalance divided rollout exists to remove: four groups of 32 requests, two
long (1000-1119 tokens) that group round-robin puts on the same instance (groups 0 and 2 ->
inst0) and two short ones (30-69 tokens) that leave the other instance idle after a second.
KV is ample (no preemption), and batches are large enough (64 long requests on one instance
against 32 on each) for the per-token cost to matter: on a latency-bound instance balance would
not change the wall time. 512-token chunks (three per long request). The simulator puts divided
rollout and context-aware scheduling 1.4x above the baseline, and ties them with it when
the long groups are swapped onto different instances (the cheap test below), so the order is
decided by balance.

History: this was the first version of the test, and it failed while only vLLM's OpenMP threads
were bound to an instance's core: the rest of every instance ran on both cores, so an instance
that fell idle handed its core to the busy one (6.2 ms per step for the baseline's busy
instance with the other idle, against 12-18 ms with both busy), and the real run measured the
chunked configurations at 0.58-0.82x of the baseline. The test then used a balanced workload
decided by the per-chunk cost, which pinned instances on a quiet machine no longer separated.
Instances are now pinned whole (seer.procs.guard --cpus), as on a cluster.
"""

import asyncio
import os
import statistics
import time
from dataclasses import replace

import pytest

from bench.compare import CompareSettings, _prompts, instance_specs, run_one
from bench.configs import BY_NAME, BenchConfig
from bench.sim.chunk_model import load_chunk_costs
from bench.sim.simulate import SimSettings, simulate
from bench.sim.speculation import AcceptanceTable
from bench.sim.step_model import load
from bench.trace_backend import TraceBackend
from bench.workloads import Workload

# The oracle is left out: in the simulator it ties divided and context here (two lengths per
# instance set, nothing to order), and its runs would add a minute to the test.
CONFIGS = ("baseline", "divided", "context")
# Each configuration runs once per round; a pair's real order is the median over rounds of the
# ratio within a round. Single runs swung by +-50% on this shared machine with unpinned instances
# (the previous, balanced workload: the baseline took 6.0 s in one run and 10.9 s in another at
# load average 15-25), and the real gap narrowed under heavy load: at load average 34 three
# rounds measured baseline/context 1.40 / 0.97 / 1.15 and baseline/divided 1.58 / 1.36 / 1.08,
# where at load average 11 they were 1.49 / 1.57 / 1.57 and 1.17 / 1.55 / 2.05. A median of three fails on two bad rounds; this is the median of five,
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

G = 32
LONG_GROUPS = (0, 2)  # group round-robin: even groups -> inst0, odd -> inst1
MAX_SEQS = 128
BLOCK = 128  # vLLM's CPU backend allocates KV in 128-token blocks; the scheduler aligns chunks to them


def hidden_lengths(long_groups=LONG_GROUPS) -> dict:
    return {(g, k): (1000 + (37 * k) % 120 if g in long_groups else 30 + (13 * k) % 40) for g in range(4) for k in range(G)}


HIDDEN = hidden_lengths()

WORKLOAD = Workload(
    "sim-vs-real", instances=2, groups=4, group_size=G, max_tokens=1536, mean_tokens=550, prompt_tokens=58,
    kv_capacity_tokens=131072, max_num_seqs=MAX_SEQS, chunk_size=512,
)


def sim_throughput(prompt_tokens: int, hidden: dict = HIDDEN) -> dict[str, float]:
    w = replace(WORKLOAD, prompt_tokens=prompt_tokens)
    settings = SimSettings(load().model, AcceptanceTable.paper(), chunk_cost=load_chunk_costs(), kv_pool=False,
                           block_size=BLOCK)
    return {c: simulate(w, BY_NAME[c], hidden, settings).stats.tokens_per_s for c in CONFIGS}


def test_the_simulator_separates_the_chunked_configurations_from_the_baseline_by_balance():
    """Cheap half of the check below (no vLLM): the simulator ranks the chunked configurations
    clearly above the baseline, and only because group round-robin stacks the long groups."""
    sim = sim_throughput(WORKLOAD.prompt_tokens)
    assert all(sim[c] > SEPARATED * sim["baseline"] for c in ("divided", "context")), sim
    balanced = sim_throughput(WORKLOAD.prompt_tokens, hidden_lengths((0, 1)))
    assert max(balanced.values()) < 1.05 * min(balanced.values()), balanced


@pytest.mark.vllm
@pytest.mark.timeout(900)  # 352 s for three rounds at load average 34; five take ~2 minutes more
def test_simulated_and_real_runs_agree_on_the_order(tiny_model, tmp_path):
    from seer.procs import cpu_sets
    from seer.fleet.pool import InstancePool

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
