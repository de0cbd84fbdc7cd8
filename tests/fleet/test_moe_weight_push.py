"""A weight push into a vLLM instance serving Qwen3-MoE serves the new experts and router.

vLLM's CPU MoE prepacks the expert weights after loading (``fused_moe/experts/cpu_moe.py``:
``process_weights_after_loading`` replaces w13/w2 with ``cpu_prepack_moe_weight``'s layout), so a
push that wrote into the loaded parameters, or a reload that skipped the repack, would keep
computing with the old experts. After an in-place push the instance's greedy tokens and log-probs
are transformers' on the pushed checkpoint, and pushing the first weights back restores them.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch

from tests.fleet.test_weight_reload import N_TOKENS, _hf_greedy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def _tiny_moe_with_tokenizer(out, tokenizer_dir, vocab: int, seed: int, perturb_from=None):
    """A random Qwen3-MoE over the tiny preset's tokenizer (vLLM needs one); or `perturb_from`'s
    weights with every tensor moved, as a training step would."""
    import transformers

    if perturb_from is None:
        cfg = transformers.Qwen3MoeConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, vocab_size=vocab,
            max_position_embeddings=4096, initializer_range=0.2, norm_topk_prob=True, tie_word_embeddings=False)
        torch.manual_seed(seed)
        model = transformers.Qwen3MoeForCausalLM(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(0.0, 0.5)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(perturb_from, dtype=torch.float32)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def test_pushed_moe_weights_are_served_as_a_fresh_load_would(tiny_model, tmp_path):
    import json

    from transformers import AutoTokenizer

    from seer.fleet.instance import InstanceSpec
    from seer.fleet.pool import InstancePool
    from seer.fleet.weights import push_weights, weight_version
    from seer.procs import free_port
    from seer.types import GenerateRequest, SamplingParams

    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    v0 = _tiny_moe_with_tokenizer(tmp_path / "v0", tiny_model, vocab, seed=0)
    v1 = _tiny_moe_with_tokenizer(tmp_path / "v1", tiny_model, vocab, seed=1, perturb_from=v0)
    prompt = AutoTokenizer.from_pretrained(tiny_model)("sum 12 7 30 =")["input_ids"]
    base_tokens, base_logprobs = _hf_greedy(v0, prompt)
    new_tokens, new_logprobs = _hf_greedy(v1, prompt)
    assert new_tokens != base_tokens

    spec = InstanceSpec(name="moe0", model=str(v0), port=free_port(), max_model_len=512,
                        kv_cache_bytes=32 * 2**20, max_num_seqs=8)
    pool = InstancePool.launch([spec], tmp_path / "logs", ready_timeout_s=600)
    client = pool.clients[0]

    async def greedy(tag):
        r = await client.generate(GenerateRequest(f"moe-{tag}", prompt, N_TOKENS, SamplingParams(temperature=0.0)))
        return r.token_ids, r.logprobs, await weight_version(client)

    async def go():
        try:
            out = {"v0": await greedy("v0")}
            await push_weights([client], str(v1), 1)
            out["v1"] = await greedy("v1")
            await push_weights([client], str(v0), 2)
            out["back"] = await greedy("back")
            return out
        finally:
            await client.close()

    try:
        out = asyncio.run(go())
    finally:
        pool.close()
    for tag, (tokens, logprobs), version in (("v0", (base_tokens, base_logprobs), 0), ("v1", (new_tokens, new_logprobs), 1),
                                             ("back", (base_tokens, base_logprobs), 2)):
        got_tokens, got_logprobs, got_version = out[tag]
        assert got_version == version, tag
        assert got_tokens == tokens, tag  # transformers' greedy tokens on the weights pushed last
        assert max(abs(a - b) for a, b in zip(got_logprobs, logprobs)) < 1e-3, tag
