"""HF -> Megatron -> HF is exact: same tensors, same logits (fp32, 1e-4); a training step's
gradients are transformers' (the config's pad_token_id row included: none from the lookup)."""

from __future__ import annotations

import json

import pytest
import torch

from seer.trainer import Trainer, TrainerConfig
from seer.trainer.hf_mapping import HFArch, hf_to_megatron, megatron_to_hf
from seer.trainer.model import forward_logits, read_hf_state_dict

LOGIT_TOL = 1e-4


def _hf_logits(path, ids):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("fixture", ["tiny_qwen2", "tiny_llama_tied", "tiny_qwen3_tied", "tiny_llama3"])
def test_megatron_matches_hf_and_export_round_trips(fixture, request, tmp_path):
    src = request.getfixturevalue(fixture)
    trainer = Trainer(src, TrainerConfig())
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        meg = forward_logits(trainer.model, ids)
    src_logits = _hf_logits(src, ids)
    assert src_logits.abs().max() > 1.0  # the logits are not all ~0, so the comparison has teeth
    assert (meg - src_logits).abs().max().item() < LOGIT_TOL

    out = trainer.export_hf(tmp_path / "export")
    original, exported = read_hf_state_dict(src), read_hf_state_dict(out)
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    assert (_hf_logits(out, ids) - meg).abs().max().item() < LOGIT_TOL
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert (out / "generation_config.json").read_text() == (src / "generation_config.json").read_text()
    with pytest.raises(ValueError):
        trainer.export_hf(src)  # never overwrite the checkpoint the trainer was loaded from


def test_llama3_rope_scaling_is_applied_with_the_configs_parameters(tiny_llama3):
    """The frequencies are transformers' for this config, and without them the logits differ."""
    import dataclasses

    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from seer.trainer.distributed import init_megatron
    from seer.trainer.model import build_gpt_model, load_hf_weights

    init_megatron(0)
    arch = HFArch.from_dir(tiny_llama3)
    assert arch.rope_scaling is not None and arch.rope_scaling.original_max_position_embeddings == 64
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](transformers.AutoConfig.from_pretrained(tiny_llama3), "cpu")
    assert torch.equal(build_gpt_model(arch).rotary_pos_emb.inv_freq, expected)
    unscaled = build_gpt_model(dataclasses.replace(arch, rope_scaling=None))
    load_hf_weights(unscaled, read_hf_state_dict(tiny_llama3), arch)
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (forward_logits(unscaled, ids) - _hf_logits(tiny_llama3, ids)).abs().max().item() > 100 * LOGIT_TOL


def test_export_after_an_update_carries_the_new_weights(tiny_qwen2, tmp_path):
    trainer = Trainer(tiny_qwen2, TrainerConfig(lr=1e-2))
    with torch.no_grad():
        trainer.model.decoder.layers[1].self_attention.linear_qkv.bias.add_(0.5)
        trainer.model.decoder.layers[0].mlp.linear_fc1.weight.mul_(1.5)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        meg = forward_logits(trainer.model, ids)
    out = trainer.export_hf(tmp_path / "export")
    diff_to_new = (_hf_logits(out, ids) - meg).abs().max().item()
    diff_to_old = (_hf_logits(tiny_qwen2, ids) - meg).abs().max().item()
    assert diff_to_new < LOGIT_TOL < diff_to_old


def test_qkv_and_fc1_fusion_layout_is_gqa_grouped():
    """Megatron's linear_qkv groups rows per KV head as [q heads of the group | k | v]."""
    arch = HFArch.from_config(
        dict(model_type="qwen2", vocab_size=8, hidden_size=4, intermediate_size=2, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, head_dim=1)
    )  # fmt: skip
    p = "model.layers.0."
    hf = {
        "model.embed_tokens.weight": torch.zeros(8, 4),
        "model.norm.weight": torch.ones(4),
        "lm_head.weight": torch.zeros(8, 4),
        p + "input_layernorm.weight": torch.ones(4),
        p + "post_attention_layernorm.weight": torch.ones(4),
        p + "self_attn.q_proj.weight": torch.tensor([[10.0], [11.0], [12.0], [13.0]]).expand(4, 4),
        p + "self_attn.k_proj.weight": torch.tensor([[20.0], [21.0]]).expand(2, 4),
        p + "self_attn.v_proj.weight": torch.tensor([[30.0], [31.0]]).expand(2, 4),
        p + "self_attn.q_proj.bias": torch.tensor([10.0, 11.0, 12.0, 13.0]),
        p + "self_attn.k_proj.bias": torch.tensor([20.0, 21.0]),
        p + "self_attn.v_proj.bias": torch.tensor([30.0, 31.0]),
        p + "self_attn.o_proj.weight": torch.zeros(4, 4),
        p + "mlp.gate_proj.weight": torch.full((2, 4), 1.0),
        p + "mlp.up_proj.weight": torch.full((2, 4), 2.0),
        p + "mlp.down_proj.weight": torch.zeros(4, 2),
    }
    meg = hf_to_megatron(hf, arch)
    m = "decoder.layers.0."
    assert meg[m + "self_attention.linear_qkv.bias"].tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    assert meg[m + "self_attention.linear_qkv.weight"][:, 0].tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    assert meg[m + "mlp.linear_fc1.weight"][:, 0].tolist() == [1, 1, 2, 2]
    back = megatron_to_hf(meg, arch)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_unsupported_configs_are_refused():
    base = dict(model_type="llama", vocab_size=8, hidden_size=4, intermediate_size=2, num_hidden_layers=1,
                num_attention_heads=2)  # fmt: skip
    with pytest.raises(NotImplementedError):
        HFArch.from_config({**base, "model_type": "gpt2"})
    with pytest.raises(NotImplementedError):
        HFArch.from_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    old_layout = HFArch.from_config({**base, "rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}})
    assert old_layout.rope_theta == 5e5 and old_layout.rope_scaling.original_max_position_embeddings == 4096
    with pytest.raises(NotImplementedError, match="yarn"):  # a legacy key beside v5's is not overlooked
        HFArch.from_config({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert HFArch.from_config({**base, "rope_theta": 5e5}).rope_theta == 5e5  # pre-v5 config layout
    with pytest.raises(NotImplementedError, match="use_sliding_window"):
        HFArch.from_config({**base, "model_type": "qwen3", "use_sliding_window": True})
    with pytest.raises(NotImplementedError, match="layer_types"):
        HFArch.from_config({**base, "layer_types": ["sliding_attention"]})
    qwen3 = HFArch.from_config({**base, "model_type": "qwen3", "head_dim": 8})
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.head_dim == 8
    with pytest.raises(NotImplementedError, match="attention_bias"):
        HFArch.from_config({**base, "model_type": "qwen3", "attention_bias": True})


# ---- first-step gradients against transformers', with the config's pad_token_id in the data ----------

PAD = 7  # the config's pad_token_id, also the trainer's padding id (seer-run sets it from the tokenizer)


def _pad_seqs():
    """Three samples of different lengths (so padded rows and streams both occur) with the pad id
    as a real token in prompts and responses, read by later positions, and a shared prompt (tree)."""
    from seer.trainer.batching import TrainSequence

    return [TrainSequence([3, PAD, 9, 12], [PAD, 20, 5], advantage=0.8),
            TrainSequence([3, PAD, 9, 12], [33, PAD, PAD, 41, 2], advantage=-0.5),
            TrainSequence([PAD, 50, 8], [11, 60], advantage=0.3)]


def _hf_grads(path, seqs) -> dict[str, torch.Tensor]:
    """Gradients of the trainer's first-step loss (on-policy PPO ratio 1: -A * log p, token-mean)
    in transformers, under HF checkpoint names (fused MoE experts split per expert as saved)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    n_tokens = sum(len(s.response_ids) for s in seqs)
    loss = 0.0
    for s in seqs:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        loss = loss - s.advantage * logp[len(s.prompt_ids) - 1:].sum() / n_tokens
    loss.backward()
    out = {}
    for name, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows then up rows
            half = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = g[e, :half]
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = g[e, half:]
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(g.shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = g[e]
        else:
            out[name] = g
    return out


@pytest.mark.parametrize("family", ["qwen3_moe", "llama"])
def test_first_step_gradients_equal_transformers_and_the_pad_row_gets_none(family, tmp_path):
    """A checkpoint whose config sets pad_token_id: transformers' nn.Embedding(padding_idx=...)
    gives that row no gradient (and initialised it to zero, so training it through RMSNorm at 0
    gave ~1e5 norms); the trainer's gradients equal transformers' in every layout, that row's
    included (zero), wherever the pad id sits in the samples."""
    from tests.trainer.conftest import make_tiny_hf, make_tiny_moe
    from tests.trainer.test_packing import _step

    if family == "qwen3_moe":
        path = make_tiny_moe(tmp_path / "ckpt", seed=3, pad_token_id=PAD)
    else:
        path = make_tiny_hf(tmp_path / "ckpt", "llama", seed=4, pad_token_id=PAD)
    arch = HFArch.from_dir(path)
    assert arch.pad_token_id == PAD and not arch.tie_word_embeddings
    seqs = _pad_seqs()
    expected = _hf_grads(path, seqs)
    assert expected["model.embed_tokens.weight"][PAD].abs().max() == 0  # transformers' side of the claim
    assert expected["model.embed_tokens.weight"][20].abs().max() > 0  # other looked-up rows do train
    trainer = Trainer(path, TrainerConfig(lr=0.0, pad_token_id=PAD))
    for layout in ("padded", "packed", "tree"):
        metrics, grads = _step(trainer, seqs, layout, "token-mean")
        ours = megatron_to_hf(grads, arch)
        assert ours.keys() == expected.keys()
        assert ours["model.embed_tokens.weight"][PAD].abs().max() == 0, layout
        for name, g in expected.items():
            torch.testing.assert_close(ours[name], g, atol=1e-5, rtol=1e-4, msg=f"{layout} {name}")
        assert metrics.grad_norm < 100.0
