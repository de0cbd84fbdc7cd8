"""megatron-core 0.16.1's MoE layers without TransformerEngine.

``megatron/core/transformer/moe/moe_utils.py`` imports ``te_general_gemm`` only inside its
``try: import transformer_engine`` block, yet ``RouterGatingLinearFunction`` (the router's linear,
lines ~1192 and ~1225) tests ``te_general_gemm is not None`` unconditionally: without TE every MoE
forward raises NameError. ``apply_moe_fixes()`` defines the name as None, which selects the
library's own torch.mm path. A no-op where TE is installed (the name exists).
"""

from __future__ import annotations


def apply_moe_fixes() -> None:
    """Idempotent; safe on CPU and GPU."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
