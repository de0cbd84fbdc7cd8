"""A tiny random Qwen3-MoE checkpoint built with transformers (no download), for routing tests.

Sizes are the smallest vLLM's CPU backend serves (head_dim 32); 8 experts, top-2, so the ids are
uint8 and a token's routing row is 2 layers x 2 = 4 bytes.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_moe(out: str | Path, *, seed: int = 0) -> Path:
    """Write the checkpoint (config, safetensors, the byte tokenizer) into `out`; returns it."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from seer.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer

    out = Path(out)
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    config = Qwen3MoeConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).to(torch.float32)
    # Random init routes near-uniformly (router logits ~ 0); a larger router spreads the choices
    # so that top-k is decided by clear margins for most tokens, as in a trained model.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(out)
    build_tokenizer(model_max_length=4096).save_pretrained(out)
    return out
