"""Exact correspondence between HF Qwen2/Qwen3/Llama checkpoints and Megatron-core GPTModel.

Two things are not a plain rename:
  * attention: HF keeps q_proj / k_proj / v_proj; Megatron fuses them into ``linear_qkv`` laid out
    per KV group as [q heads of the group | k | v] (GQA layout), for weights and Qwen2's biases;
  * SwiGLU MLP: HF's gate_proj and up_proj are stacked into ``linear_fc1`` as [gate; up], which is
    what Megatron's gated_linear_unit splits in half (silu(first) * second).
Everything else is a rename (Qwen3's per-head ``q_norm`` / ``k_norm`` are Megatron's
``q_layernorm`` / ``k_layernorm``: RMSNorm over head_dim, one weight shared by every head). Both directions are exact inverses (tests round-trip them).
MoE layers (Qwen3-MoE's router and experts) are mapped by ``seer.trainer.moe``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from seer.trainer.moe import MoEArch, hf_layer_to_megatron, megatron_layer_to_hf

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe", "llama")
SUPPORTED_ROPE_TYPES = ("default", "llama3")


def _rope_type(rope: dict) -> str:
    return rope.get("rope_type", rope.get("type", "default"))


def supported_summary() -> str:
    """What the trainer trains, in one line for error messages (the checks are HFArch.from_config's)."""
    return (f"model_type {', '.join(SUPPORTED_MODEL_TYPES)}; rope_type {', '.join(SUPPORTED_ROPE_TYPES)}; "
            "SwiGLU (silu) MLPs; full attention (no sliding window); q/k/v biases as Qwen2 has them, "
            "no other biases")


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's RoPE frequency scaling (config ``rope_type: llama3``), as transformers reads it."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class HFArch:
    """The architecture facts of a HF config.json that the Megatron model must reproduce."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool = False  # Qwen3: RMSNorm of each head's q and k before RoPE
    rope_scaling: Llama3RopeScaling | None = None  # None: default RoPE
    moe: MoEArch | None = None  # the sparse layers of a MoE model (Qwen3-MoE); None: dense
    # config.pad_token_id: transformers' nn.Embedding padding_idx (its lookup gives that row no
    # gradient); None: the config sets none
    pad_token_id: int | None = None

    @classmethod
    def from_config(cls, cfg: dict) -> HFArch:
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise NotImplementedError(f"model_type {model_type!r} is not supported (have {SUPPORTED_MODEL_TYPES})")
        if cfg.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {cfg['hidden_act']!r}: only SwiGLU (silu) MLPs are supported")
        # transformers v5 writes rope_parameters; older configs rope_scaling (+ a top-level rope_theta)
        ropes = [r for r in (cfg.get("rope_parameters"), cfg.get("rope_scaling")) if r]
        for r in ropes:
            if _rope_type(r) not in SUPPORTED_ROPE_TYPES:
                raise NotImplementedError(f"rope_type {_rope_type(r)!r} is not supported (have {SUPPORTED_ROPE_TYPES})")
        rope = next((r for r in ropes if _rope_type(r) != "default"), ropes[0] if ropes else {})
        rope_type = _rope_type(rope)
        rope_theta = float(next((r["rope_theta"] for r in ropes if "rope_theta" in r), cfg.get("rope_theta", 10000.0)))
        max_positions = int(cfg.get("max_position_embeddings", 4096))
        rope_scaling = None
        if rope_type == "llama3":
            rope_scaling = Llama3RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope.get("original_max_position_embeddings") or max_positions),
            )
        if cfg.get("use_sliding_window", False):
            raise NotImplementedError("use_sliding_window: sliding-window attention is not supported")
        if any(t != "full_attention" for t in cfg.get("layer_types") or ()):
            raise NotImplementedError(f"layer_types {sorted(set(cfg['layer_types']))}: only full_attention is supported")
        if model_type in ("llama", "qwen3", "qwen3_moe") and (cfg.get("attention_bias") or cfg.get("mlp_bias")):
            raise NotImplementedError(f"{model_type} attention_bias / mlp_bias are not supported")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            rope_scaling=rope_scaling,
            moe=MoEArch.from_config(cfg, layers) if model_type == "qwen3_moe" else None,
            pad_token_id=_pad_token_id(cfg),
        )

    @classmethod
    def from_dir(cls, hf_dir: str | Path) -> HFArch:
        return cls.from_config(json.loads((Path(hf_dir) / "config.json").read_text()))

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def _pad_token_id(cfg: dict) -> int | None:
    """config.pad_token_id as transformers reads it for nn.Embedding(padding_idx=...), checked."""
    pad = cfg.get("pad_token_id")
    if pad is None:
        return None
    vocab = int(cfg["vocab_size"])
    if isinstance(pad, bool) or not isinstance(pad, int) or not -vocab <= pad < vocab:
        raise ValueError(f"config.json pad_token_id {pad!r} is not a token id of the vocab ({vocab})")
    return pad % vocab  # nn.Embedding takes a negative padding_idx from the end


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: HFArch) -> torch.Tensor:
    """[nq*d, ...], [nkv*d, ...], [nkv*d, ...] -> Megatron [nkv * (hpg + 2) * d, ...]."""
    g, d, hpg = arch.num_kv_heads, arch.head_dim, arch.heads_per_group
    tail = q.shape[1:]
    fused = torch.cat([q.reshape(g, hpg * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail)], dim=1)
    return fused.reshape(g * (hpg + 2) * d, *tail)


def _split_qkv(qkv: torch.Tensor, arch: HFArch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, hpg = arch.num_kv_heads, arch.head_dim, arch.heads_per_group
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (hpg + 2) * d, *tail)
    q, k, v = torch.split(grouped, [hpg * d, d, d], dim=1)
    return (
        q.reshape(g * hpg * d, *tail).contiguous(),
        k.reshape(g * d, *tail).contiguous(),
        v.reshape(g * d, *tail).contiguous(),
    )


def hf_to_megatron(hf: dict[str, torch.Tensor], arch: HFArch) -> dict[str, torch.Tensor]:
    """HF state dict (``model.`` prefixed names) -> Megatron GPTModel state dict (no _extra_state)."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"]}
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = h + "self_attn."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "self_attention.linear_qkv.weight"] = _fuse_qkv(
            hf[a + "q_proj.weight"], hf[a + "k_proj.weight"], hf[a + "v_proj.weight"], arch
        )
        if arch.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = _fuse_qkv(
                hf[a + "q_proj.bias"], hf[a + "k_proj.bias"], hf[a + "v_proj.bias"], arch
            )
        if arch.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = hf[a + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[a + "k_norm.weight"]
        out[m + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        if arch.moe is not None and i in arch.moe.layers:
            out.update(hf_layer_to_megatron(hf, h, m, arch.moe))
            continue
        out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]], 0)
        out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if not arch.tie_word_embeddings:
        out["output_layer.weight"] = hf["lm_head.weight"]
    return out


def megatron_to_hf(meg: dict[str, torch.Tensor], arch: HFArch) -> dict[str, torch.Tensor]:
    """Inverse of ``hf_to_megatron``; tied models omit lm_head.weight, as HF checkpoints do."""
    out = {"model.embed_tokens.weight": meg["embedding.word_embeddings.weight"]}
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = h + "self_attn."
        out[h + "input_layernorm.weight"] = meg[m + "input_layernorm.weight"]
        q, k, v = _split_qkv(meg[m + "self_attention.linear_qkv.weight"], arch)
        out[a + "q_proj.weight"], out[a + "k_proj.weight"], out[a + "v_proj.weight"] = q, k, v
        if arch.qkv_bias:
            qb, kb, vb = _split_qkv(meg[m + "self_attention.linear_qkv.bias"], arch)
            out[a + "q_proj.bias"], out[a + "k_proj.bias"], out[a + "v_proj.bias"] = qb, kb, vb
        if arch.qk_norm:
            out[a + "q_norm.weight"] = meg[m + "self_attention.q_layernorm.weight"]
            out[a + "k_norm.weight"] = meg[m + "self_attention.k_layernorm.weight"]
        out[a + "o_proj.weight"] = meg[m + "self_attention.linear_proj.weight"]
        out[h + "post_attention_layernorm.weight"] = meg[m + "pre_mlp_layernorm.weight"]
        if arch.moe is not None and i in arch.moe.layers:
            out.update(megatron_layer_to_hf(meg, h, m, arch.moe))
            continue
        gate, up = torch.chunk(meg[m + "mlp.linear_fc1.weight"], 2, dim=0)
        out[h + "mlp.gate_proj.weight"] = gate.contiguous()
        out[h + "mlp.up_proj.weight"] = up.contiguous()
        out[h + "mlp.down_proj.weight"] = meg[m + "mlp.linear_fc2.weight"]
    out["model.norm.weight"] = meg["decoder.final_layernorm.weight"]
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = meg["output_layer.weight"]
    return out
