"""A step-time model for the paper's clusters from published sizes: a roofline, no fitted constants.

The measured model (`step_model.py`) is fitted to a 2-layer, hidden-64 model on one CPU core. Its
proportions are that machine's: a fixed 2.6 ms per step, 33 us per computed position and 97 ns
per context token. At the paper's contexts (hundreds of thousands of KV tokens per instance) the
context term is then ~95% of every step, so a step costs about the same per request whatever the
batch, and verifying draft tokens costs almost nothing next to it. On the paper's hardware the
proportions differ: reading the weights (every expert is touched at these batch sizes) costs about
as much as reading a full KV cache, and each computed position costs real FLOPs.

This module gives the same linear form with coefficients from the model's and the GPU's published
numbers, at their peaks (no efficiency factor, nothing fitted to the paper's results):

    fixed       = weight bytes per GPU / HBM bandwidth       (each GPU reads its share every step)
    per_token   = 2 x activated params / (GPUs x peak FLOPS)   (one computed position: decode or draft)
    per_context = KV bytes per token / (GPUs x HBM bandwidth)  (attention reads each request's KV once
                                                                per step, however many positions)
    prefill     = per_token                                    (recompute is compute-bound)

Not modelled: tensor-parallel all-reduces and expert-parallel all-to-all (both add per-step and
per-token time), attention FLOPs (decode with GQA/MLA and a few query positions stays below the
H800's ridge point), kernel efficiency below peak. `python -m bench.sim --step-model roofline`
uses it; the default stays the measured model.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.sim.step_model import StepModel


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_per_s: float
    flops: dict[str, float]  # peak dense FLOPS by weight dtype


# NVIDIA H800 SXM5 (the paper's GPU): HBM3 3.35 TB/s; dense BF16 989 TFLOPS, FP8 1979 TFLOPS.
H800 = Gpu("H800 SXM5", 3.35e12, {"bf16": 989e12, "fp8": 1979e12})


@dataclass(frozen=True)
class ModelSpec:
    name: str
    total_params: float
    active_params: float  # per token (MoE: shared + routed experts)
    weight_dtype: str  # "bf16" | "fp8"
    kv_bytes_per_token: int  # all layers, bf16 KV cache

    @property
    def weight_bytes(self) -> float:
        return self.total_params * (1 if self.weight_dtype == "fp8" else 2)


def _mla(layers: int, kv_lora_rank: int = 512, rope_dim: int = 64) -> int:
    """MLA caches one compressed latent plus the rope key per layer (vLLM's layout), bf16."""
    return layers * (kv_lora_rank + rope_dim) * 2


def _gqa(layers: int, kv_heads: int, head_dim: int) -> int:
    return layers * 2 * kv_heads * head_dim * 2


# Model cards and configs: Moonlight-16B-A3B (DeepSeek-V3 architecture, 27 layers, MLA),
# Qwen2-VL-72B (its Qwen2-72B language model: 80 layers, 8 KV heads of 128), Kimi-K2 (1.04T
# total, 32B active, 61 layers, MLA, released in FP8).
MODELS: dict[str, ModelSpec] = {
    "moonlight": ModelSpec("Moonlight-16B-A3B", 16e9, 3e9, "bf16", _mla(27)),
    "qwen2vl72b": ModelSpec("Qwen2-VL-72B", 72.7e9, 72.7e9, "bf16", _gqa(80, 8, 128)),
    "kimik2": ModelSpec("Kimi-K2", 1.04e12, 32e9, "fp8", _mla(61)),
}


def roofline(model: ModelSpec, gpus: int, gpu: Gpu = H800) -> StepModel:
    """Per-instance step model for `model` spread over `gpus` GPUs (TP or DP+EP: work splits evenly)."""
    per_token = 2.0 * model.active_params / (gpus * gpu.flops[model.weight_dtype])
    return StepModel(
        fixed_s=model.weight_bytes / gpus / gpu.hbm_bytes_per_s,
        per_token_s=per_token,
        per_context_s=model.kv_bytes_per_token / (gpus * gpu.hbm_bytes_per_s),
        prefill_per_token_s=per_token,
    )


def describe(name: str, gpus: int, gpu: Gpu = H800) -> str:
    m = MODELS[name]
    s = roofline(m, gpus, gpu)
    return (f"{m.name} on {gpus} x {gpu.name} (roofline): step = {s.fixed_s * 1e3:.2f} ms + "
            f"{s.per_token_s * 1e6:.2f} us/token + {s.per_context_s * 1e9:.3f} ns/context-token; "
            f"prefill {s.prefill_per_token_s * 1e6:.2f} us/token")
