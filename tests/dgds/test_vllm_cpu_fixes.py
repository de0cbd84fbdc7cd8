"""vLLM 0.32's CPU rejection sampler, in this process: the bug ``seer.dgds.vllm_cpu_fixes``
corrects, and the sampled distribution with the correction (no engine needed; ~15 s, mostly
importing vLLM). The end-to-end check on a real instance is in test_vllm_proposer.py."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")


@pytest.fixture
def cpu_kernels():
    """vLLM's CPU kernel overrides as an engine worker registers them (worker_base.py:282)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON or not current_platform.is_cpu():
        pytest.skip("only vLLM's CPU backend without Triton-CPU replaces the sampler kernels")
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def _expanded_temperature(rs):
    temperature = torch.tensor([1.0, 0.7, 0.0], dtype=torch.float32)
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    return rs.expand_batch_to_tokens(temperature, cu, 6, replace_from=0, replace_to=1).tolist()


EXPANDED = pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.0])


def test_vllm_cpu_expand_override_drops_float_output(cpu_kernels):
    """The cause, as installed: vLLM's CPU ``expand_kernel`` writes into an int64 copy of the float
    output and drops it. If this starts failing, vLLM fixed it and the correction can go."""
    assert _expanded_temperature(cpu_kernels) != EXPANDED


def test_fix_expands_per_request_values_in_their_dtype(cpu_kernels):
    from seer.dgds.vllm_cpu_fixes import apply_cpu_sampling_fixes

    assert apply_cpu_sampling_fixes() is True
    assert apply_cpu_sampling_fixes() is False  # once is enough
    assert _expanded_temperature(cpu_kernels) == EXPANDED
    top_k = torch.tensor([5, 0], dtype=torch.int32)
    out = cpu_kernels.expand_batch_to_tokens(top_k, torch.tensor([3, 4], dtype=torch.int32), 4)
    assert out.dtype == torch.int32 and out.tolist() == [5, 5, 5, 0]


def _first_token_distribution(rs, logits_row, temperature: float, draft_token: int, rows: int = 20000):
    """Rows of one drafted token each, through vLLM's own sampling path for drafted positions
    (apply_sampling_constraints + rejection_sample, as RejectionSampler.forward calls them)."""
    vocab = logits_row.shape[0]
    meta = types.SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.full((rows,), temperature),
                                 top_k=None, top_p=None, generators={})
    cu = torch.arange(1, rows + 1, dtype=torch.int32)
    target = rs.apply_sampling_constraints(logits_row.repeat(rows, 1), cu, meta)
    drafts = torch.full((rows,), draft_token, dtype=torch.int32)
    bonus = torch.zeros((rows, 1), dtype=torch.int64)
    out = rs.rejection_sample(drafts, [1] * rows, 1, cu, None, target, bonus, meta)
    return torch.bincount(out[:, 0].long(), minlength=vocab).double() / rows


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_drafted_positions_sample_the_target_distribution(cpu_kernels, temperature):
    """Lossless speculative sampling: whatever the draft, the token decided at a drafted position
    follows softmax(logits / T). Without the correction the total variation is ~0.3-0.4."""
    from seer.dgds.vllm_cpu_fixes import apply_cpu_sampling_fixes

    apply_cpu_sampling_fixes()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, generator=gen) * 2
    torch.manual_seed(1)
    got = _first_token_distribution(cpu_kernels, logits, temperature, draft_token=3)
    want = torch.softmax(logits / temperature, -1).double()
    tv = 0.5 * (got - want).abs().sum().item()
    assert tv < 0.03, f"total variation {tv:.3f} at T={temperature} (sampling noise ~0.01)"
