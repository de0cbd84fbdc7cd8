"""Run as a script (tests/compat/test_vllm_cpu_fixes.py does): vLLM's CPU rejection sampler in a fresh
process, set up as an engine worker sets it up, before and after seer.compat.vllm_cpu_fixes. Prints
one JSON object. A fresh process because vLLM's kernel registration scans every loaded module and
trips over some (llvmlite's, once numba compiled something), as a test process may have them."""

from __future__ import annotations

import json
import types


def expanded_temperature(rs) -> list[float]:
    import torch

    temperature = torch.tensor([1.0, 0.7, 0.0], dtype=torch.float32)
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    return rs.expand_batch_to_tokens(temperature, cu, 6, replace_from=0, replace_to=1).tolist()


def drafted_position_tv(rs, temperature: float, rows: int = 20000, vocab: int = 16, draft_token: int = 3) -> float:
    """Rows of one drafted token each through vLLM's sampling path for drafted positions
    (apply_sampling_constraints + rejection_sample, as RejectionSampler.forward calls them): total
    variation between the token decided there and softmax(logits / T)."""
    import torch

    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 2
    torch.manual_seed(1)
    meta = types.SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.full((rows,), temperature),
                                 top_k=None, top_p=None, generators={})
    cu = torch.arange(1, rows + 1, dtype=torch.int32)
    target = rs.apply_sampling_constraints(logits.repeat(rows, 1), cu, meta)
    drafts = torch.full((rows,), draft_token, dtype=torch.int32)
    bonus = torch.zeros((rows, 1), dtype=torch.int64)
    out = rs.rejection_sample(drafts, [1] * rows, 1, cu, None, target, bonus, meta)
    got = torch.bincount(out[:, 0].long(), minlength=vocab).double() / rows
    want = torch.softmax(logits / temperature, -1).double()
    return 0.5 * (got - want).abs().sum().item()


def main() -> None:
    import torch
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    res: dict = {"applicable": current_platform.is_cpu() and not HAS_TRITON}
    if res["applicable"]:
        current_platform.register_triton_kernel_overrides()  # as worker_base.py:282 does
        from vllm.v1.sample import rejection_sampler as rs

        from seer.compat.vllm_cpu_fixes import apply_cpu_sampling_fixes

        res["before"] = {"expanded": expanded_temperature(rs),
                         "tv": {str(t): drafted_position_tv(rs, t) for t in (1.0, 0.5)}}
        res["applied"] = [apply_cpu_sampling_fixes(), apply_cpu_sampling_fixes()]
        top_k = rs.expand_batch_to_tokens(torch.tensor([5, 0], dtype=torch.int32),
                                          torch.tensor([3, 4], dtype=torch.int32), 4)
        res["after"] = {"expanded": expanded_temperature(rs), "top_k": [str(top_k.dtype), top_k.tolist()],
                        "tv": {str(t): drafted_position_tv(rs, t) for t in (1.0, 0.5)}}
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
