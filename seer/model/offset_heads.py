"""Initial layer-0 attention heads that look a fixed number of tokens back.

Why: every step of the default task is computed from the line above it, digit under digit, so
the model must attend exactly one line length back. Learned from scratch, that pattern takes a
small model thousands of steps on a CPU; started as a prior it takes a few hundred
(docs/bench-log.md, "Measurements behind design notes"). Only the initial values
change: every weight is trained as usual, and the architecture stays a plain Qwen2.

How: with constant query and key biases, a RoPE score depends only on the distance between
query and key; choosing the query bias's phase per frequency pair puts the peak `offset`
tokens back. The projection weights start small so that content does not yet blur the peak.

Families without q/k biases (Qwen3, Llama) get the same constant terms through one embedding
channel held at the same value for every token: after the input RMSNorm it is nearly constant,
and the q/k weight columns reading it act as the biases (with tied embeddings a constant
channel shifts every logit equally, so the output is unchanged). Qwen3's QK-norm rescales each
head's q and k to unit RMS; its gains are set so that the peak score is the biased model's.
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
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    half = head_dim // 2
    if len(offsets) > cfg.num_attention_heads or pairs > half:
        raise ValueError(f"{len(offsets)} offsets / {pairs} pairs do not fit {cfg.num_attention_heads} heads of {head_dim}")
    inv_freq = model.model.rotary_emb.inv_freq.tolist()  # the model's own (Llama 3's scaled ones too)
    k_bias = torch.zeros(cfg.num_key_value_heads, head_dim)
    k_bias[:, :pairs] = amplitude  # phase 0 in the highest-frequency pairs
    q_bias = torch.zeros(cfg.num_attention_heads, head_dim)
    for h, offset in enumerate(offsets):
        for i in range(pairs):
            # score(delta) = A^2 * sum_i cos((delta + offset) * w_i): largest at delta = -offset
            phase = -offset * inv_freq[i]
            q_bias[h, i] = amplitude * math.cos(phase)
            q_bias[h, i + half] = amplitude * math.sin(phase)
    with torch.no_grad():
        attn.q_proj.weight.mul_(weight_scale)
        attn.k_proj.weight.mul_(weight_scale)
        if attn.q_proj.bias is not None and attn.k_proj.bias is not None:
            attn.q_proj.bias.view(cfg.num_attention_heads, head_dim)[: len(offsets)] = q_bias[: len(offsets)]
            attn.k_proj.bias.copy_(k_bias.flatten())
        else:
            _biases_through_a_constant_channel(model, q_bias, k_bias, len(offsets))
        if getattr(attn, "q_norm", None) is not None:  # Qwen3: unit-RMS q and k, scaled back up
            gain = amplitude * math.sqrt(pairs / head_dim)
            attn.q_norm.weight.fill_(gain)
            attn.k_norm.weight.fill_(gain)


def _biases_through_a_constant_channel(model: torch.nn.Module, q_bias: torch.Tensor, k_bias: torch.Tensor,
                                       n_heads: int) -> None:
    """Emulate q/k biases: the last embedding channel is the same for every token and as large as
    the other channels together, whose norm is made the same for every token (a rescale of the
    random init), so after RMSNorm the channel is exactly sqrt(hidden / 2) for every token; the q/k
    weight columns that read it carry bias / that value."""
    embed = model.get_input_embeddings().weight
    hidden = embed.shape[1]
    rest = embed[:, :-1].norm(dim=1, keepdim=True)
    level = float(rest.median())
    used = rest[:, 0] > 0  # the padding token's row is all zeros (nn.Embedding's padding_idx): it stays so
    embed[used, :-1] *= level / rest[used]
    embed[used, -1] = level
    normed = math.sqrt(hidden / 2) * float(model.model.layers[0].input_layernorm.weight[-1])
    attn = model.model.layers[0].self_attn
    head_dim = q_bias.shape[1]
    attn.q_proj.weight[: n_heads * head_dim, -1] = q_bias[:n_heads].flatten() / normed
    attn.k_proj.weight[:, -1] = k_bias.flatten() / normed
