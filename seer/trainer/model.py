"""Build a Megatron-core GPTModel that is the same network as a HF Qwen2/Qwen3/Llama checkpoint.

The layer spec is Megatron's local (non-Transformer-Engine) one on CPU and GPU alike, so the math
is identical on both and on a GPU nothing depends on TE being installed. Dropout is off: RL
log-probs must match the inference engine, which never drops.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.transformer_config import TransformerConfig
from safetensors.torch import load_file

from seer.trainer import moe as moe_layers
from seer.trainer import tp_shard
from seer.trainer.attention import StreamLayout, current_layout, stream_attention, stream_layout, use_positioned_rope
from seer.trainer.config import TrainerConfig
from seer.trainer.hf_mapping import HFArch, hf_to_megatron, megatron_to_hf


def tensor_parallel_place() -> tuple[int, int]:
    """(tp rank, tp size) of this process from Megatron's parallel state; (0, 1) before it exists."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1
    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


def expert_parallel_size() -> int:
    """Expert-parallel ranks of this process from Megatron's parallel state; 1 before it exists."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_expert_model_parallel_world_size()


def transformer_config(arch: HFArch, params_dtype: torch.dtype = torch.float32,
                       tensor_parallel: int = TrainerConfig.tensor_parallel, *,
                       moe_aux_loss_coef: float = TrainerConfig.moe_aux_loss_coef,
                       routing_replay: bool = TrainerConfig.routing_replay,
                       expert_parallel: int = TrainerConfig.expert_parallel) -> TransformerConfig:
    moe = {} if arch.moe is None else moe_layers.config_kwargs(
        arch.moe, arch.num_layers, aux_loss_coef=moe_aux_loss_coef, expert_parallel=expert_parallel,
        routing_replay=routing_replay)
    return TransformerConfig(
        tensor_model_parallel_size=tensor_parallel,
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        # Weights come from the checkpoint right after construction: skip random init.
        perform_initialization=False,
        use_cpu_initialization=True,
        # Unfused paths: the fused kernels are CUDA-only and the unfused ones are exact.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        **moe,
    )


class CausalSDPAttention(DotProductAttention):
    """Megatron's local core attention through ``torch.nn.functional.scaled_dot_product_attention``.

    The local DotProductAttention materialises [b, heads, s, s] scores and a separate softmax,
    which dominates a GRPO step's forward on long padded rollouts (docs/bench-log.md). SDPA runs a
    fused (flash-style) causal kernel on CPU and GPU alike, with the same math. Only causal masks
    reach it (``forward_logits`` passes nothing else), so the mask tensor itself is not needed.
    Under a packed/tree ``stream_layout`` (seer/trainer/attention.py) each block attends to its own
    path only.
    """

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        assert packed_seq_params is None and attention_bias is None
        # [s, b, heads, dim] -> [b, heads, s, dim]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        layout = current_layout()
        if layout is not None:
            ctx = stream_attention(q, k, v, layout, self.softmax_scale)
        else:
            ctx = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=k.size(1) != q.size(1)
            )
        # [b, heads, s, dim] -> [s, b, hidden]
        return ctx.permute(2, 0, 1, 3).reshape(ctx.size(2), ctx.size(0), -1)


def build_gpt_model(arch: HFArch, params_dtype: torch.dtype = torch.float32, *,
                    padded_vocab_size: int | None = None, parallel_output: bool = False,
                    moe_aux_loss_coef: float = TrainerConfig.moe_aux_loss_coef,
                    routing_replay: bool = TrainerConfig.routing_replay) -> GPTModel:
    """An uninitialised GPTModel with the HF architecture (call after ``init_megatron``).

    Under tensor parallelism (Megatron's parallel state) the vocab is padded to a multiple of tp
    unless `padded_vocab_size` says otherwise; ``forward_logits`` slices the padding off again.
    With ``parallel_output=False`` the output layer all-gathers the vocab-parallel logits, so every
    TP rank sees the full logits and the losses stay TP-unaware.
    """
    _, tp_size = tensor_parallel_place()
    tp_shard.check_tp(arch, tp_size)
    vocab = padded_vocab_size or tp_shard.padded_vocab_size(arch.vocab_size, tp_size)
    if vocab < arch.vocab_size or vocab % tp_size:
        raise ValueError(f"padded_vocab_size {vocab} must be >= vocab {arch.vocab_size} and a multiple of tp {tp_size}")
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=arch.qk_norm)
    spec.submodules.self_attention.submodules.core_attention = CausalSDPAttention
    ep_size = expert_parallel_size()
    if arch.moe is not None:
        from seer.compat.megatron_moe_fixes import apply_moe_fixes

        apply_moe_fixes()
        moe_layers.check_parallel(arch.moe, tp_size, ep_size)
        spec = moe_layers.block_spec(spec, arch.moe, arch.num_layers)
    model = GPTModel(
        config=transformer_config(arch, params_dtype, tp_size, moe_aux_loss_coef=moe_aux_loss_coef,
                                  routing_replay=routing_replay, expert_parallel=ep_size),
        transformer_layer_spec=spec,
        vocab_size=vocab,
        max_sequence_length=arch.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=arch.rope_theta,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        parallel_output=parallel_output,
    )
    if arch.rope_scaling is not None:
        _scale_rope_llama3(model, arch)
    model.real_vocab_size = arch.vocab_size  # forward_logits drops the padded logit columns
    if arch.pad_token_id is not None:
        no_lookup_gradient_for(model.embedding.word_embeddings, arch.pad_token_id)
    use_positioned_rope(model)  # packed/tree streams: RoPE at each token's position in its own sequence
    if arch.moe is not None:
        moe_layers.after_build(model)
    tp_shard.mark_tp_params(model.named_parameters())
    return model


class _NoGradientAt(torch.autograd.Function):
    """Identity forward; backward drops the gradient at the masked token positions."""

    @staticmethod
    def forward(ctx, x, mask):
        ctx.save_for_backward(mask)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad.masked_fill(mask.unsqueeze(-1), 0.0), None


def no_lookup_gradient_for(word_embeddings: torch.nn.Module, pad_token_id: int) -> None:
    """The embedding lookup gives row `pad_token_id` no gradient, as transformers'
    ``nn.Embedding(padding_idx=config.pad_token_id)`` does for Qwen2/Qwen3/Qwen3-MoE/Llama: the
    lookup's output gradient is dropped wherever the input is that token (the forward is
    unchanged; a tied output layer still trains the row, as in transformers).

    Without it a checkpoint whose pad row is zero (transformers initialises padding_idx to zero)
    trains that row through RMSNorm at 0, whose slope is 1/sqrt(eps): ~1e5 gradient norms from
    one pad-id token in a prompt or response. Megatron's VocabParallelEmbedding all-reduces its
    output across TP ranks (no sequence parallelism here), so the output is [b, s, h] beside the
    [b, s] input on every rank and every layout (padded rows, packed and tree streams) alike.
    """
    if getattr(word_embeddings, "reduce_scatter_embeddings", False):
        raise NotImplementedError("pad_token_id with sequence-parallel embeddings (reduce-scatter) is not supported")

    def hook(module, args, output):
        if not torch.is_grad_enabled() or not output.requires_grad:
            return output
        mask = args[0] == pad_token_id
        if output.shape[:-1] != mask.shape:
            raise RuntimeError(f"embedding output {tuple(output.shape)} does not line up with its input {tuple(mask.shape)}")
        return _NoGradientAt.apply(output, mask)

    word_embeddings.register_forward_hook(hook)


def _scale_rope_llama3(model: GPTModel, arch: HFArch) -> None:
    """Llama 3.1's RoPE frequencies with the checkpoint's parameters.

    Megatron's own switch (``rope_scaling=True``) takes only the factor and hard-codes the other
    three; its ``_apply_scaling`` is transformers' formula line for line, so it is called here
    with every parameter the config names (tests compare the logits with transformers').
    """
    rope, scaling = model.rotary_pos_emb, arch.rope_scaling
    rope.inv_freq = rope._apply_scaling(
        rope.inv_freq, factor=scaling.factor, low_freq_factor=scaling.low_freq_factor,
        high_freq_factor=scaling.high_freq_factor,
        original_max_position_embeddings=scaling.original_max_position_embeddings,
    )


def read_hf_state_dict(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF safetensors checkpoint (single file or sharded with an index)."""
    hf_dir = Path(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (hf_dir / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {hf_dir}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(hf_dir / name)))
    return state


def load_hf_weights(model: GPTModel, hf_state: dict[str, torch.Tensor], arch: HFArch) -> None:
    """Copy HF weights into the model; every Megatron parameter must be covered.

    Under tensor parallelism each rank loads its own shard (``tp_shard.shard_state``), under expert
    parallelism its own experts (``moe.ep_local_state``).
    """
    meg = hf_to_megatron(hf_state, arch)
    tp_rank, tp_size = tensor_parallel_place()
    if tp_size > 1:
        meg = tp_shard.shard_state(meg, arch, tp_rank, tp_size)
    if arch.moe is not None and expert_parallel_size() > 1:
        from megatron.core import parallel_state

        meg = moe_layers.ep_local_state(meg, arch.moe.num_experts, parallel_state.get_expert_model_parallel_rank(),
                                        expert_parallel_size())
    result = model.load_state_dict(meg, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise KeyError(f"HF -> Megatron mapping mismatch: missing {missing}, unexpected {result.unexpected_keys}")


def megatron_weights_as_hf(model: GPTModel, arch: HFArch, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The model's weights under HF names as fresh CPU tensors (no aliasing: safetensors-ready).

    Under tensor parallelism this is a collective: every TP rank must call it, and each gets the
    full weights.
    """
    meg = {
        k: v
        for k, v in model.state_dict().items()
        if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")
    }
    if tensor_parallel_place()[1] > 1:
        meg = tp_shard.gather_state(meg, arch)
    if arch.moe is not None and expert_parallel_size() > 1:
        from megatron.core import parallel_state

        meg = moe_layers.ep_full_state(meg, parallel_state.get_expert_model_parallel_group())
    hf = megatron_to_hf(meg, arch)
    return {k: v.detach().to("cpu", dtype=dtype or v.dtype).clone() for k, v in hf.items()}


def causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    """[1, 1, s, s] boolean mask, True above the diagonal (= masked out), as Megatron expects.

    Passed explicitly so Megatron never builds its default mask, which it allocates on "cuda".
    """
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]


def forward_logits(model: GPTModel, input_ids: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """Logits [B, S, V] for right-padded input_ids [B, S], V the real (unpadded) vocab.

    Right padding needs no attention mask beyond the causal one: real tokens never attend to
    the pad positions after them, and pad positions are masked out of every loss. Padded vocab
    columns (TP) are sliced off here, before any softmax can see them; `vocab_size` defaults to
    the one ``build_gpt_model`` recorded.
    """
    b, s = input_ids.shape
    position_ids = torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)
    logits = model(input_ids, position_ids, causal_mask(s, input_ids.device))
    vocab = vocab_size or getattr(model, "real_vocab_size", None)
    if vocab is not None and logits.shape[-1] > vocab:
        logits = logits[..., :vocab]
    return logits


def forward_stream_logits(model: GPTModel, input_ids: torch.Tensor, layout: StreamLayout,
                          vocab_size: int | None = None) -> torch.Tensor:
    """Logits [N, V] for a packed or prefix-tree stream input_ids [N] (no padding anywhere)."""
    n = input_ids.numel()
    with stream_layout(layout):
        # the [1, 1] mask is never read: CausalSDPAttention takes the blocks from the layout
        logits = model(input_ids.view(1, n), layout.positions.view(1, n),
                       torch.zeros(1, 1, 1, 1, dtype=torch.bool, device=input_ids.device))
    logits = logits[0]
    vocab = vocab_size or getattr(model, "real_vocab_size", None)
    if vocab is not None and logits.shape[-1] > vocab:
        logits = logits[..., :vocab]
    return logits
