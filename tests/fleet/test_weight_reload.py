"""In-place weight reload gives exactly what a fresh load of the same checkpoint gives.

Regression: on vLLM's CPU backend the tied lm_head (tie_word_embeddings) computes logits from a
packed copy of the embedding matrix (`layer.cpu_linear`); vLLM's layerwise reload never re-packed
it, so after a weight push the instance sampled from new hidden states and OLD output embeddings.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

N_TOKENS = 24


def _hf_greedy(path, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Transformers' greedy tokens on `path` and the logprob of each one."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=N_TOKENS, do_sample=False)
        logits = hf(out).logits[0, len(prompt) - 1:-1]
    tokens = out[0, len(prompt):]
    return tokens.tolist(), torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0].tolist()


def test_repack_stale_cpu_gemms_only_touches_unrefreshed_layers():
    """Unit level (no vLLM): layers the reload re-packed are left alone, stale ones re-packed."""
    from seer.fleet.weight_ext import _cpu_gemm_closures, _repack_stale_cpu_gemms

    class Method:
        def process_weights_after_loading(self, layer):
            w = layer.weight.detach().clone()
            layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, w, bias)

    def packed(weight):
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(weight, requires_grad=False)
        m.quant_method = Method()
        m.quant_method.process_weights_after_loading(m)
        return m

    model = torch.nn.Module()
    model.embed = packed(torch.zeros(4, 3))
    model.head = packed(torch.zeros(4, 3))
    model.head.weight = model.embed.weight  # tied
    model.proj = packed(torch.zeros(2, 3))
    before = _cpu_gemm_closures(model)
    assert set(before) == {model.embed, model.head, model.proj}

    # the "reload": new values in place; embed and proj were re-packed, the tied head was not
    model.embed.weight.data.fill_(1.0)
    model.embed.quant_method.process_weights_after_loading(model.embed)
    model.proj.weight.data.fill_(2.0)
    model.proj.quant_method.process_weights_after_loading(model.proj)
    proj_linear = model.proj.cpu_linear
    x = torch.ones(1, 3)
    assert model.head.cpu_linear(x, None, None).abs().max() == 0  # stale

    assert _repack_stale_cpu_gemms(model, before) == ["head"]
    assert torch.equal(model.head.cpu_linear(x, None, None), torch.full((1, 4), 3.0))
    assert model.proj.cpu_linear is proj_linear

    # a packed layer whose unpacked weight is gone and which got nothing new: refuse loudly
    before = _cpu_gemm_closures(model)
    model.proj.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    model.embed.quant_method.process_weights_after_loading(model.embed)
    with pytest.raises(RuntimeError, match="proj"):
        _repack_stale_cpu_gemms(model, before)


@pytest.mark.vllm
def test_in_place_reload_matches_transformers_and_restores(vllm_pool, tiny_model, tmp_path):
    """On the shared instances: new weights in place, exact generation, versions, stale refusal."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seer.types import GenerateRequest, SamplingParams
    from seer.fleet.weights import StaleWeightsError, push_weights, require_version, weight_version

    tok = AutoTokenizer.from_pretrained(tiny_model)
    prompt = tok("sum 12 7 30 =")["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert hf.config.tie_word_embeddings  # the case that broke
    with torch.no_grad():  # a different policy: perturb every weight
        g = torch.Generator().manual_seed(0)
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    hf.save_pretrained(tmp_path / "v1")
    base_tokens, _ = _hf_greedy(tiny_model, prompt)
    new_tokens, new_logprobs = _hf_greedy(tmp_path / "v1", prompt)
    assert new_tokens != base_tokens
    clients = vllm_pool.clients

    async def greedy(client, tag):
        r = await client.generate(
            GenerateRequest(f"reload-{tag}-{client.name}", prompt, N_TOKENS, SamplingParams(temperature=0.0)))
        return r.token_ids, r.logprobs

    async def go():
        try:
            steps = {"before": ([await greedy(c, "before") for c in clients], [await weight_version(c) for c in clients])}
            for tag, path, version in [("v1", tmp_path / "v1", 1), ("restored", tiny_model, 2),
                                       ("v1-again", tmp_path / "v1", 3)]:
                await push_weights(clients, str(path), version)
                steps[tag] = ([await greedy(c, tag) for c in clients], [await weight_version(c) for c in clients])
            await require_version(clients, 3)
            with pytest.raises(StaleWeightsError, match="serve"):
                await require_version(clients, 4)  # an iteration cannot start on stale weights
            await push_weights(clients, str(tiny_model), 0)  # leave the shared instances as found
            return steps
        finally:
            for c in clients:
                await c.close()

    steps = asyncio.run(go())
    before, v0 = steps["before"]
    assert v0 == [0, 0] and all(tokens == base_tokens for tokens, _ in before)
    for tag, version in [("v1", 1), ("v1-again", 3)]:
        outs, v = steps[tag]
        assert v == [version, version]
        for tokens, logprobs in outs:
            # exactly transformers' greedy generation on the pushed checkpoint ...
            assert tokens == new_tokens, tag
            # ... with its logprobs (the stale tied lm_head was off by whole nats)
            assert max(abs(a - b) for a, b in zip(logprobs, new_logprobs)) < 1e-3, tag
    restored, v = steps["restored"]
    assert v == [2, 2]
    for (tokens, lp), (tokens0, lp0) in zip(restored, before):
        assert tokens == tokens0 and max(abs(a - b) for a, b in zip(lp, lp0)) < 1e-4
