import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from seer.model.offset_heads import init_offset_heads


@pytest.mark.parametrize("offsets", [(8, 1, 3, 9), (2, 7, 5, 4)])
def test_layer0_heads_start_looking_their_offset_back(offsets):
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    init_offset_heads(model, offsets)
    ids = torch.randint(0, 64, (1, 120))
    with torch.no_grad():
        attn = model(input_ids=ids, output_attentions=True).attentions[0][0]  # heads x query x key
    for h, offset in enumerate(offsets):
        for q in (60, 90, 119):
            assert q - int(attn[h, q, : q + 1].argmax()) == offset


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_families_without_qk_biases_get_offset_heads_through_a_constant_channel(family):
    """Qwen3 (QK-norm) and Llama 3 (scaled RoPE) have no q/k biases: the same heads appear."""
    from transformers import AutoModelForCausalLM

    from seer.model.build import hf_config
    from seer.model.presets import PRESETS, ArchSpec

    extra = {"rope_theta": 500000.0, "llama3_rope": PRESETS["llama3"].arch.llama3_rope} if family == "llama3" else {}
    cfg = hf_config(ArchSpec(hidden_size=128, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=128,
                             family=family, **extra))
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is None
    offsets = (8, 1, 3, 9)
    init_offset_heads(model, offsets)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the all-zero padding row too
    ids = torch.randint(4, 260, (1, 120))  # the byte tokens: the padding token never sits mid-sequence
    with torch.no_grad():
        attn = model(input_ids=ids, output_attentions=True).attentions[0][0]
    for h, offset in enumerate(offsets):
        for q in (60, 90, 119):
            assert q - int(attn[h, q, : q + 1].argmax()) == offset


def test_too_many_offsets_is_an_error():
    cfg = Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="do not fit"):
        init_offset_heads(Qwen2ForCausalLM(cfg), (1, 2, 3))
