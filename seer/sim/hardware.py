"""A step-time model for the paper's clusters from published sizes: a roofline, no fitted constants.

The measured model (`step_model.py`) is fitted to a 2-layer, hidden-64 model on one CPU core. Its
proportions are that machine's: a fixed 2.6 ms per step, 33 us per computed position and 97 ns
per context token. At the paper's contexts (hundreds of thousands of KV tokens per instance) the
context term is then ~95% of every step, so a step costs about the same per request whatever the
batch, and verifying draft tokens costs almost nothing next to it. On the paper's hardware the
proportions differ: reading the weights costs about as much as reading a full KV cache, and each
computed position costs real FLOPs.

This module gives the same linear form with coefficients from the model's and the GPU's published
numbers, at their peaks (no efficiency factor, nothing fitted to the paper's results):

    fixed       = weight bytes per GPU / HBM bandwidth       (each GPU reads its share every step)
    experts     = routed-expert bytes per GPU / HBM bandwidth x (1 - (1 - k/n)^positions)
                  (a mixture of experts on its own GPUs, Moonlight: a step reads the experts its
                  positions were routed to, k of n each, uniformly; at Moonlight's ~15-20 chunks
                  per instance that is ~3/4 of them, with 9 positions per request all of them)
    per_token   = 2 x activated params / (GPUs x peak FLOPS)   (one computed position: decode or draft)
    per_context = KV bytes per token / (GPUs x HBM bandwidth)  (attention reads each request's KV once
                                                                per step, however many positions)
    prefill     = per_token                                    (recompute is compute-bound)

Data-parallel attention (Kimi-K2's DP32/EP32): every rank holds a full copy of the non-expert
weights (attention, dense layers, shared experts, embeddings) and 1/ranks of the routed experts,
so a GPU reads more than weights / GPUs per step and has less memory left for KV.

Attention compute with several query positions (speculative verification): attention reads each
context token's KV once per step, but computes on it once per query position. Its arithmetic
intensity is `attn_flops_per_kv_byte` per position (MLA: ~2 x query heads, FlashMLA's published
analysis; GQA: query heads / KV heads), so with p positions it stays memory-bound while
p x intensity is below the GPU's ridge point (BF16 FLOPS / bandwidth) and costs
p x intensity / ridge times the memory-bound time above it (`attention_multiplier`).

Expert-parallel all-to-all (Kimi-K2's EP32): every position a rank computes is dispatched to its
experts' ranks and combined back, at every MoE layer. Its cost per position is DeepEP's published
low-latency kernels on the paper's hardware (H800, CX7 400 Gb/s InfiniBand, 128 tokens per rank,
hidden 7168, top-8, FP8 dispatch, BF16 combine: the DeepSeek-V3 setting, which is Kimi-K2's):
dispatch + combine latency at the EP size, over 128 tokens, times the MoE layers. The kernels run
at 48-53 GB/s of the NIC's ~50 there, i.e. bandwidth-bound, so the cost is taken per token (the
kernels' latency floor at small batches, unpublished, is left out: it would only make speculation
cheaper to switch off). It counts on the rank's own positions, like its attention, so a step waits
for the busiest rank's all-to-all; it applies under either step model, being the network's.

Not modelled: tensor-parallel all-reduces, the quadratic attention FLOPs of a long prefill, kernel
efficiency below peak, overlap of the all-to-all with compute (two micro-batches).
`python -m bench.sim` uses it for the paper's scenarios; `--step-model measured` the fit instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from seer.sim.step_model import StepModel


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_per_s: float
    flops: dict[str, float]  # peak dense FLOPS by weight dtype
    memory_bytes: float

    @property
    def attention_ridge(self) -> float:
        """FLOPs per byte above which attention (BF16, whatever the weights' dtype) is compute-bound."""
        return self.flops["bf16"] / self.hbm_bytes_per_s


# NVIDIA H800 SXM5 (the paper's GPU): HBM3 at 3.35 TB/s; dense BF16 989 TFLOPS, FP8 1979 TFLOPS;
# "80 GB" is 81559 MiB as nvidia-smi and torch report it for the 80 GB H100/H800 SXM5, the total
# vLLM's gpu_memory_utilization is a fraction of.
H800 = Gpu("H800 SXM5", 3.35e12, {"bf16": 989e12, "fp8": 1979e12}, 81559 * 2**20)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    total_params: float
    active_params: float  # per token (MoE: shared + routed experts)
    weight_dtype: str  # "bf16" | "fp8"
    kv_bytes_per_token: int  # all layers, bf16 KV cache
    attn_flops_per_kv_byte: float  # attention FLOPs per KV byte read, per query position
    # Under data-parallel attention: the parameters every rank holds in full (all but the routed
    # experts), and those of them a token activates (computed on the token's own rank).
    replicated_params: float = 0.0
    replicated_active_params: float = 0.0
    # Mixture of experts (for the expert-parallel all-to-all): layers with routed experts, hidden size,
    # routed experts per token. 0 MoE layers: dense (no all-to-all, whatever the parallelism).
    moe_layers: int = 0
    hidden: int = 0
    experts_per_token: int = 0
    # For the expert reads of a small batch: routed experts per MoE layer and their parameters in all.
    # 0: every expert counts as read every step (dense, or enough tokens that all are touched).
    routed_experts: int = 0
    routed_params: float = 0.0

    @property
    def bytes_per_param(self) -> int:
        return 1 if self.weight_dtype == "fp8" else 2

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.bytes_per_param


def _mla(layers: int, kv_lora_rank: int = 512, rope_dim: int = 64) -> int:
    """MLA caches one compressed latent plus the rope key per layer (vLLM's layout), bf16."""
    return layers * (kv_lora_rank + rope_dim) * 2


def _mla_intensity(heads: int, kv_lora_rank: int = 512, rope_dim: int = 64) -> float:
    """MLA decode (absorbed): per query position and context token each head computes
    2 x (latent + rope) FLOPs for QK and 2 x latent for PV over (latent + rope) x 2 bytes of KV:
    ~2 x heads FLOPs per byte (FlashMLA's analysis: compute-bound once heads x positions >= 128
    on an H800)."""
    return heads * 2 * ((kv_lora_rank + rope_dim) + kv_lora_rank) / ((kv_lora_rank + rope_dim) * 2)


def _gqa(layers: int, kv_heads: int, head_dim: int) -> int:
    return layers * 2 * kv_heads * head_dim * 2


def _gqa_intensity(q_heads: int, kv_heads: int) -> float:
    """GQA: 4 x q_heads x head_dim FLOPs (QK and PV) per 4 x kv_heads x head_dim bytes (K and V, bf16)."""
    return q_heads / kv_heads


# Kimi-K2's split under DP attention, from its config (hidden 7168, 61 layers, the first dense with
# an 18432 FFN, MLA with 64 heads, q_lora 1536, kv_lora 512; 384 routed experts of 2048, 8 active,
# 1 shared; vocabulary 163840): attention 6.17B + dense FFN 0.40B + shared experts 2.64B +
# embedding and LM head 2 x 1.17B = 11.56B held by every rank; of a token's 31.5B active, 10.38B
# (all but the 8 routed experts) run on its own rank.
KIMI_K2_REPLICATED = 11.56e9
KIMI_K2_REPLICATED_ACTIVE_SHARE = 10.38 / 31.52

# Model cards and configs: Moonlight-16B-A3B (DeepSeek-V3 architecture, 27 layers, MLA with 16
# heads), Qwen2-VL-72B (its Qwen2-72B language model: 80 layers, 64 query heads, 8 KV heads of
# 128), Kimi-K2 (1.04T total, 32B active, 61 layers, MLA with 64 heads, released in FP8).
MODELS: dict[str, ModelSpec] = {
    # Moonlight's config: hidden 2048, 26 of 27 layers with 64 routed experts of 1408 (6 per token)
    # plus 2 shared: 26 x 64 x 3 x 2048 x 1408 = 14.39B routed parameters.
    "moonlight": ModelSpec("Moonlight-16B-A3B", 16e9, 3e9, "bf16", _mla(27), _mla_intensity(16),
                           moe_layers=26, hidden=2048, experts_per_token=6, routed_experts=64,
                           routed_params=26 * 64 * 3 * 2048 * 1408),
    "qwen2vl72b": ModelSpec("Qwen2-VL-72B", 72.7e9, 72.7e9, "bf16", _gqa(80, 8, 128), _gqa_intensity(64, 8)),
    "kimik2": ModelSpec("Kimi-K2", 1.04e12, 32e9, "fp8", _mla(61), _mla_intensity(64),
                        replicated_params=KIMI_K2_REPLICATED,
                        replicated_active_params=32e9 * KIMI_K2_REPLICATED_ACTIVE_SHARE,
                        moe_layers=60, hidden=7168, experts_per_token=8),
}

# DeepEP's README, "Low-latency kernels with pure RDMA": H800 + CX7 400 Gb/s, 128 tokens per rank,
# hidden 7168, top-8 experts, FP8 dispatch and BF16 combine. EP size -> (dispatch, combine) seconds.
DEEPEP_H800_LOW_LATENCY: dict[int, tuple[float, float]] = {
    8: (77e-6, 114e-6), 16: (118e-6, 195e-6), 32: (155e-6, 273e-6),
    64: (173e-6, 314e-6), 128: (192e-6, 369e-6), 256: (194e-6, 360e-6),
}
DEEPEP_TOKENS, DEEPEP_HIDDEN, DEEPEP_TOPK = 128, 7168, 8


def alltoall_per_position_s(model: ModelSpec, ep_size: int) -> float:
    """Seconds of expert-parallel dispatch + combine per position a rank computes (0 without EP).

    DeepEP's measured latency at `ep_size` (the nearest published size at or above it) per token,
    scaled by the bytes moved (hidden x experts per token) and the MoE layers."""
    if ep_size <= 1 or not model.moe_layers:
        return 0.0
    size = min((e for e in DEEPEP_H800_LOW_LATENCY if e >= ep_size), default=max(DEEPEP_H800_LOW_LATENCY))
    dispatch, combine = DEEPEP_H800_LOW_LATENCY[size]
    volume = (model.hidden / DEEPEP_HIDDEN) * (model.experts_per_token / DEEPEP_TOPK)
    return model.moe_layers * (dispatch + combine) / DEEPEP_TOKENS * volume


def weight_bytes_per_gpu(model: ModelSpec, gpus: int, dp_ranks: int = 1) -> float:
    """Weights each GPU holds (and reads every step): an even share under tensor parallelism; under
    data-parallel attention over the same GPUs, the replicated part in full plus 1/gpus of the rest."""
    if dp_ranks <= 1:
        return model.weight_bytes / gpus
    return (model.replicated_params + (model.total_params - model.replicated_params) / gpus) * model.bytes_per_param


def kv_capacity_tokens(model: ModelSpec, gpus: int, memory_fraction: float, dp_ranks: int = 1,
                       gpu: Gpu = H800) -> int:
    """KV tokens an instance holds when vLLM may use `memory_fraction` of each GPU's memory
    (`gpu_memory_utilization`): what the weights leave, over the KV bytes per token. Under tensor
    parallelism every GPU holds a slice of every token's KV; under DP attention each rank holds
    whole tokens of its own requests, so the instance's total is dp_ranks pools of a GPU's leftover.
    Activation and CUDA-graph memory are not subtracted."""
    left = memory_fraction * gpu.memory_bytes - weight_bytes_per_gpu(model, gpus, dp_ranks)
    if left <= 0:
        raise ValueError(f"{model.name} on {gpus} GPUs (DP {dp_ranks}): weights exceed "
                         f"{memory_fraction:.2f} of {gpu.memory_bytes / 1e9:.0f} GB")
    return int(left * gpus / model.kv_bytes_per_token)


def memory_fraction_for(model: ModelSpec, gpus: int, kv_tokens: float, dp_ranks: int = 1, gpu: Gpu = H800) -> float:
    """Inverse of kv_capacity_tokens: the gpu_memory_utilization that leaves `kv_tokens` per instance."""
    return (kv_tokens * model.kv_bytes_per_token / gpus + weight_bytes_per_gpu(model, gpus, dp_ranks)) / gpu.memory_bytes


def attention_ridge_positions(model: ModelSpec, gpu: Gpu = H800) -> float:
    """Query positions per request beyond which decode attention is compute-bound on `gpu`."""
    return gpu.attention_ridge / model.attn_flops_per_kv_byte


def dp_local_share(model: ModelSpec) -> float:
    """Share of a token's per-position compute done on its own DP-attention rank (the rest, the
    routed experts, is spread over every GPU by expert parallelism). 1.0 without DP attention."""
    return model.replicated_active_params / model.active_params if model.replicated_active_params else 1.0


def roofline(model: ModelSpec, gpus: int, gpu: Gpu = H800, dp_ranks: int = 1) -> StepModel:
    """Per-instance step model for `model` spread over `gpus` GPUs, with the work of a balanced
    batch split evenly; each GPU reads its own weights every step (more than weights / gpus under
    DP attention, which replicates the non-expert layers)."""
    per_token = 2.0 * model.active_params / (gpus * gpu.flops[model.weight_dtype])
    weights_s = weight_bytes_per_gpu(model, gpus, dp_ranks) / gpu.hbm_bytes_per_s
    # Without expert parallelism a small batch reads only the experts its tokens were routed to.
    experts_s = model.routed_params * model.bytes_per_param / gpus / gpu.hbm_bytes_per_s \
        if model.routed_experts and dp_ranks <= 1 else 0.0
    return StepModel(
        fixed_s=weights_s - experts_s,
        per_token_s=per_token,
        per_context_s=model.kv_bytes_per_token / (gpus * gpu.hbm_bytes_per_s),
        prefill_per_token_s=per_token,
        experts_s=experts_s,
        experts=model.routed_experts if experts_s else 0,
        experts_per_token=model.experts_per_token if experts_s else 0,
    )


def describe(name: str, gpus: int, gpu: Gpu = H800, dp_ranks: int = 1) -> str:
    m = MODELS[name]
    s = roofline(m, gpus, gpu, dp_ranks)
    dp = f" (DP attention over {dp_ranks} ranks)" if dp_ranks > 1 else ""
    experts = (f" + {s.experts_s * 1e3:.2f} ms x (1 - (1 - {s.experts_per_token}/{s.experts})^tokens) of routed "
               f"experts") if s.experts_s else ""
    a2a = alltoall_per_position_s(m, gpus) if dp_ranks > 1 else 0.0
    a2a_text = f"; expert-parallel all-to-all {a2a * 1e6:.1f} us per position on a rank (DeepEP, H800)" if a2a else ""
    return (f"{m.name} on {gpus} x {gpu.name}{dp} (roofline): step = {s.fixed_s * 1e3:.2f} ms{experts} + "
            f"{s.per_token_s * 1e6:.2f} us/token + {s.per_context_s * 1e9:.3f} ns/context-token; "
            f"prefill {s.prefill_per_token_s * 1e6:.2f} us/token{a2a_text}")
