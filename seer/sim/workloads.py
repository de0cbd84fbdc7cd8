"""Benchmark workloads: the paper's three (Table 3) and small ones for this machine.

A workload fixes everything a configuration comparison must hold constant: groups, group size,
length limit, the hidden length distribution (heavy-tailed and correlated within a group, as
the paper observes), chunk size and the cluster (instances, KV capacity, batch limit). Both the
simulator and the trace-driven real benchmark draw their hidden lengths from here, so "the same
workload" means the same numbers in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from seer.sim.hardware import MODELS, kv_capacity_tokens, memory_fraction_for

LengthKey = tuple[int, int]  # (group_id, sample_index)


# The paper's chunk size for its three workloads (workload data, not Seer's default)
PAPER_CHUNK_SIZE = 8192

@dataclass(frozen=True)
class LengthModel:
    """Group-correlated lognormal lengths, clipped to [min_tokens, max_tokens].

    Fitted to two published numbers, the mean and the maximum: the lognormal's (mu, sigma) are
    solved so that a share `truncated` of responses reaches the limit (the pile-up at max_tokens
    of truncated reasoning traces) and the clipped mean equals `mean_tokens`. The log-variance is
    then split between groups and responses by the intraclass correlation `icc`: a group's median
    is exp(mu + sqrt(icc) * sigma * Z_g), each response multiplies it by
    exp(sqrt(1 - icc) * sigma * Z). A high icc is what context-aware scheduling exploits.
    """

    mean_tokens: float
    max_tokens: int
    min_tokens: int = 16
    truncated: float = 0.05
    icc: float = 0.6

    def __post_init__(self) -> None:
        if not self.min_tokens <= self.mean_tokens <= self.max_tokens:
            raise ValueError(f"need min_tokens <= mean_tokens <= max_tokens, got {self}")
        if not 0 < self.truncated < 0.5 or not 0 <= self.icc <= 1:
            raise ValueError("truncated must be in (0, 0.5) and icc in [0, 1]")

    def params(self) -> tuple[float, float]:
        """(mu, sigma): P(L >= max) = truncated and E[clip(L)] = mean (bisection on sigma)."""
        z = np.random.default_rng(12345).standard_normal(40000)
        q = float(np.quantile(z, 1 - self.truncated))
        log_max = math.log(self.max_tokens)

        def mean_for(sigma: float) -> float:
            mu = log_max - q * sigma
            return float(np.clip(np.exp(mu + sigma * z), self.min_tokens, self.max_tokens).mean())

        lo, hi = 1e-3, 6.0  # the clipped mean falls as sigma grows (mu moves down faster)
        for _ in range(80):
            mid = (lo + hi) / 2
            if mean_for(mid) > self.mean_tokens:
                lo = mid
            else:
                hi = mid
        sigma = (lo + hi) / 2
        return log_max - q * sigma, sigma

    def sample(self, groups: int, group_size: int, seed: int) -> dict[LengthKey, int]:
        """Hidden target lengths of one iteration: {(group, sample): tokens}."""
        rng = np.random.default_rng(seed)
        mu, sigma = self.params()
        zg = rng.standard_normal(groups)
        zw = rng.standard_normal((groups, group_size))
        x = np.exp(mu + sigma * (math.sqrt(self.icc) * zg[:, None] + math.sqrt(1 - self.icc) * zw))
        x = np.clip(np.rint(x), self.min_tokens, self.max_tokens).astype(int)
        return {(g, k): int(x[g, k]) for g in range(groups) for k in range(group_size)}


@dataclass(frozen=True)
class Workload:
    """One rollout iteration and the cluster it runs on.

    Token quantities are real tokens. `token_unit` is the simulator's granularity: it simulates
    one "token" per `token_unit` real tokens (lengths, chunks, KV all divided by it) so that
    paper-scale iterations stay fast; timing multiplies back. Real runs use token_unit = 1.
    """

    name: str
    instances: int
    groups: int
    group_size: int
    max_tokens: int
    mean_tokens: float
    prompt_tokens: int
    kv_capacity_tokens: int  # per instance (all its DP ranks together)
    max_num_seqs: int  # per engine: per instance, or per rank under DP attention (vLLM's batch limit)
    chunk_size: int
    gpus_per_instance: int = 1  # the step-time model's variable terms are divided by this
    dp_ranks: int = 1  # data-parallel attention ranks per instance, each with its own KV pool
    truncated: float = 0.05  # share of responses that reach max_tokens
    icc: float = 0.6  # intraclass correlation of log-lengths within a group
    token_unit: int = 1
    paper_scale: float = 1.0  # fraction of the paper's instances and requests simulated
    temperature: float = 1.0

    @property
    def requests(self) -> int:
        return self.groups * self.group_size

    @property
    def lengths(self) -> LengthModel:
        return LengthModel(self.mean_tokens, self.max_tokens, min(16, self.max_tokens), self.truncated, self.icc)

    def hidden_lengths(self, seed: int) -> dict[LengthKey, int]:
        return self.lengths.sample(self.groups, self.group_size, seed)

    def scaled(self, fraction: float) -> Workload:
        """Fewer instances and proportionally fewer groups (same load per instance)."""
        inst = max(1, round(self.instances * fraction))
        f = inst / self.instances
        return replace(self, instances=inst, groups=max(1, round(self.groups * f)), paper_scale=self.paper_scale * f)


# Memory left to vLLM on the paper's clusters (docs/bench.md, "Memory"). The paper publishes one
# number that pins it: its Qwen2-VL-72B baseline preempts 13,686 times in one iteration.
# `python -m bench.sim.calibrate` finds the KV capacity per instance at which the simulated baseline
# does the same (bench/results/sim/sim_calibration.md); it corresponds to vLLM being given this share of
# each GPU's memory (weights + KV; activations not counted), near veRL's default rollout setting
# (gpu_memory_utilization 0.5).
QWEN2VL72B_KV_CALIBRATED = 626_880  # tokens per TP8 instance
ROLLOUT_MEMORY_FRACTION = memory_fraction_for(MODELS["qwen2vl72b"], 8, QWEN2VL72B_KV_CALIBRATED)
# Nothing published pins Moonlight's or Kimi-K2's memory. Moonlight: the same share of GPU memory
# as the calibrated Qwen2-VL-72B runs (same cluster, same veRL baseline). Kimi-K2: that share
# barely holds its weights (43.7 GB of FP8 per GPU under DP32/EP32 attention, which replicates the
# non-expert layers on every rank) and leaves each rank ~2K KV tokens, not one 98K-token response
# (vLLM refuses to start so), so its deployment must have given vLLM more; vLLM's own default
# (gpu_memory_utilization 0.9) is assumed.
KIMI_K2_MEMORY_FRACTION = 0.9

# Paper Table 3. GPUs per instance and parallelism as published: Moonlight 1 GPU, Qwen2-VL-72B TP8
# (one KV pool sharded by heads), Kimi-K2 DP32/EP32 (32 attention ranks, each its own KV pool).
# max_num_seqs 1024 per engine: veRL's rollout default and vLLM's own on 80 GB GPUs.
# The within-group correlation is not published ("strongly correlated within a group"): PAPER_ICC is
# calibrated on the one published figure it decides, context-aware scheduling at 96% of the oracle
# (docs/bench.md, "Current result", change 5); Table 4, which the bar checks, is not used.
PAPER_ICC = 0.98
PAPER_WORKLOADS: dict[str, Workload] = {
    "moonlight": Workload(
        "moonlight", instances=32, groups=400, group_size=8, max_tokens=65536, mean_tokens=22386,
        prompt_tokens=1024, kv_capacity_tokens=kv_capacity_tokens(MODELS["moonlight"], 1, ROLLOUT_MEMORY_FRACTION),
        max_num_seqs=1024, chunk_size=PAPER_CHUNK_SIZE, gpus_per_instance=1, token_unit=64, icc=PAPER_ICC,
    ),
    "qwen2vl72b": Workload(
        "qwen2vl72b", instances=16, groups=600, group_size=16, max_tokens=40960, mean_tokens=7615,
        prompt_tokens=1024, kv_capacity_tokens=QWEN2VL72B_KV_CALIBRATED, max_num_seqs=1024, chunk_size=PAPER_CHUNK_SIZE,
        gpus_per_instance=8, token_unit=32, temperature=0.8, icc=PAPER_ICC,
    ),
    "kimik2": Workload(
        "kimik2", instances=8, groups=800, group_size=8, max_tokens=98304, mean_tokens=38959,
        prompt_tokens=1024,
        kv_capacity_tokens=kv_capacity_tokens(MODELS["kimik2"], 32, KIMI_K2_MEMORY_FRACTION, dp_ranks=32),
        max_num_seqs=1024, chunk_size=PAPER_CHUNK_SIZE, gpus_per_instance=32, dp_ranks=32, token_unit=128, icc=PAPER_ICC,
    ),
}

# Paper Table 4 (cumulative ablation, throughput relative to the baseline).
PAPER_TABLE4: dict[str, dict[str, float]] = {
    "moonlight": {"baseline": 1.0, "divided": 1.41, "context": 1.47, "grouped_sd": 1.90},
    "qwen2vl72b": {"baseline": 1.0, "divided": 1.42, "context": 1.56, "grouped_sd": 2.04},
    "kimik2": {"baseline": 1.0, "divided": 1.16, "context": 1.27, "grouped_sd": 1.53},
}

# Small trace-driven workload for two 1-core instances of the tiny model here.
SMALL = Workload(
    "small", instances=2, groups=8, group_size=4, max_tokens=512, mean_tokens=150,
    prompt_tokens=24, kv_capacity_tokens=4096, max_num_seqs=64, chunk_size=128,
)
