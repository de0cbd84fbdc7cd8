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


def test_too_many_offsets_is_an_error():
    cfg = Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="do not fit"):
        init_offset_heads(Qwen2ForCausalLM(cfg), (1, 2, 3))
