"""Initial layer-0 attention heads that look a fixed number of tokens back.

Why: every step of the default task is computed from the line above it, digit under digit, so
the model must attend exactly one line length back. Learned from scratch, that pattern takes a
small model thousands of steps on a CPU; started as a prior it takes a few hundred
(docs/bench-log.md, "Measurements behind design notes"). Only the initial values
change: every weight is trained as usual, and the architecture stays a plain Qwen2.

How: with constant query and key biases, a RoPE score depends only on the distance between
query and key; choosing the query bias's phase per frequency pair puts the peak `offset`
tokens back. The projection weights start small so that content does not yet blur the peak.
"""

from __future__ import annotations

import math

import torch


def init_offset_heads(
    model: torch.nn.Module,
    offsets: tuple[int, ...],
    *,
    amplitude: float = 4.0,
    pairs: int = 8,
    weight_scale: float = 0.25,
) -> None:
    """Make query head h of layer 0 attend `offsets[h]` tokens back (heads beyond stay as they are)."""
    cfg = model.config
    attn = model.model.layers[0].self_attn
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    half = head_dim // 2
    if len(offsets) > cfg.num_attention_heads or pairs > half:
        raise ValueError(f"{len(offsets)} offsets / {pairs} pairs do not fit {cfg.num_attention_heads} heads of {head_dim}")
    if attn.q_proj.bias is None or attn.k_proj.bias is None:
        raise ValueError("offset heads need query and key biases (Qwen2 has them)")
    theta = cfg.rope_parameters["rope_theta"]
    inv_freq = [theta ** (-2 * i / head_dim) for i in range(half)]  # as in HF's default RoPE
    with torch.no_grad():
        attn.q_proj.weight.mul_(weight_scale)
        attn.k_proj.weight.mul_(weight_scale)
        k_bias = attn.k_proj.bias.view(cfg.num_key_value_heads, head_dim)
        k_bias.zero_()
        k_bias[:, :pairs] = amplitude  # phase 0 in the highest-frequency pairs
        q_bias = attn.q_proj.bias.view(cfg.num_attention_heads, head_dim)
        for h, offset in enumerate(offsets):
            q_bias[h].zero_()
            for i in range(pairs):
                # score(delta) = A^2 * sum_i cos((delta + offset) * w_i): largest at delta = -offset
                phase = -offset * inv_freq[i]
                q_bias[h, i] = amplitude * math.cos(phase)
                q_bias[h, i + half] = amplitude * math.sin(phase)
