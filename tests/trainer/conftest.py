"""Tiny HF checkpoints built inside the tests, so the trainer tests depend on nothing else in Seer."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

warnings.filterwarnings("ignore", message="Apex is not installed")
torch.set_num_threads(1)


# head_dim 16 at theta 5e5: wavelengths 6.3, 32, 167, ... tokens, so one frequency is kept, one is
# smoothed and the rest are divided by the factor (original context 64: low 64, high 16 tokens)
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)


def make_tiny_hf(out_dir: Path, model_type: str = "qwen2", tie: bool = False, seed: int = 0,
                 pad_token_id: int | None = None) -> Path:
    """`pad_token_id`: the config's, which transformers makes nn.Embedding's padding_idx (that row
    initialised to zero and never given a gradient by the embedding lookup)."""
    import transformers

    common = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=64,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        initializer_range=0.2,  # larger than default so logits differ visibly between tokens
        rope_theta=50000.0 if model_type == "qwen2" else 10000.0,
        pad_token_id=pad_token_id,
    )
    torch.manual_seed(seed)
    if model_type == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    elif model_type == "qwen3":  # QK-norm, and a head_dim decoupled from hidden / heads as Qwen3's
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=32))
    elif model_type == "llama3":  # Llama 3.1's RoPE scaling, shaped so that a 24-token sequence feels it
        config = transformers.LlamaConfig(**common)
        config.rope_parameters = dict(LLAMA3_ROPE, rope_theta=500000.0)
        model = transformers.LlamaForCausalLM(config)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    # HF initialises biases to 0 and norms to 1; randomise them so a swapped or dropped mapping shows
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.2)
            elif "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("tiny_qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_llama_tied(tmp_path_factory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("tiny_llama_tied"), "llama", tie=True, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen3_tied(tmp_path_factory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("tiny_qwen3_tied"), "qwen3", tie=True, seed=2)


@pytest.fixture(scope="session")
def tiny_llama3(tmp_path_factory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("tiny_llama3"), "llama3", seed=3)


def make_tiny_moe(out_dir: Path, seed: int = 0, norm_topk_prob: bool = True, mlp_only_layers: tuple = (),
                  hidden: int = 64, pad_token_id: int | None = None) -> Path:
    """A random Qwen3-MoE: 2 layers, 8 experts, top-2 (QK-norm as Qwen3); routers and norms randomised
    so that every token prefers clearly different experts and a dropped mapping shows."""
    import transformers

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, vocab_size=64,
        max_position_embeddings=256, initializer_range=0.2, norm_topk_prob=norm_topk_prob,
        mlp_only_layers=list(mlp_only_layers), tie_word_embeddings=False, pad_token_id=pad_token_id,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    return make_tiny_moe(tmp_path_factory.mktemp("tiny_moe"))
