"""Attention over a packed or prefix-tree token stream, and RoPE at each token's own position.

A packed or tree micro-batch is one stream of N tokens (Megatron's [s=N, b=1] layout) cut into
blocks: a block's queries are a contiguous run of the stream, its keys/values are its ancestors'
tokens (a trie node's path from the root) followed by its own, causal within its own. A packed
sequence is one block without ancestors. Each block is one ``scaled_dot_product_attention`` call,
so no [N, N] mask is ever built (measured in docs/trainer.md: a dense block-diagonal mask is ~9x
slower on CPU, and CPU flex_attention has no backward).

The layout travels in a context variable (``stream_layout``) rather than through Megatron's
``packed_seq_params``, whose THD path needs Transformer Engine: the same code runs on CPU and GPU.
Megatron's RoPE uses the stream index as the position (GPTModel ignores ``position_ids`` under
rope), so ``PositionedRotaryEmbedding`` indexes the table by the layout's positions instead.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding


@dataclass
class Block:
    """Queries stream[start:end]; keys/values stream[context] then stream[start:end], causal within."""

    start: int
    end: int
    context: torch.Tensor | None = None  # long indices of the ancestors' tokens (root first), or None


@dataclass
class StreamLayout:
    """Where each token of a stream sits: its position in its own sequence and its attention block."""

    positions: torch.Tensor  # [N] long: the token's index in its own sequence (RoPE)
    blocks: list[Block]  # in stream order, covering [0, N) exactly
    _masks: dict = field(default_factory=dict, repr=False)

    def to(self, device: torch.device) -> StreamLayout:
        blocks = [Block(b.start, b.end, None if b.context is None else b.context.to(device)) for b in self.blocks]
        return StreamLayout(self.positions.to(device), blocks)

    def mask(self, n_q: int, n_ctx: int, device: torch.device) -> torch.Tensor:
        """[n_q, n_ctx + n_q] bool, True = attend: every context token, and causal within the block."""
        key = (n_q, n_ctx, device)
        if key not in self._masks:
            self._masks[key] = torch.ones(n_q, n_ctx + n_q, dtype=torch.bool, device=device).tril(n_ctx)
        return self._masks[key]


_LAYOUT: ContextVar[StreamLayout | None] = ContextVar("seer_stream_layout", default=None)


@contextmanager
def stream_layout(layout: StreamLayout):
    """Run a model forward (and its backward graph's construction) over a packed/tree stream."""
    token = _LAYOUT.set(layout)
    try:
        yield layout
    finally:
        _LAYOUT.reset(token)


def current_layout() -> StreamLayout | None:
    return _LAYOUT.get()


def stream_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: StreamLayout,
                     scale: float | None) -> torch.Tensor:
    """q [1, heads, N, d], k/v [1, kv_heads, N, d] -> [1, heads, N, d], one SDPA call per block."""
    gqa = k.size(1) != q.size(1)
    outs = []
    for b in layout.blocks:
        qb, kb, vb = q[:, :, b.start:b.end], k[:, :, b.start:b.end], v[:, :, b.start:b.end]
        if b.context is None or b.context.numel() == 0:
            outs.append(F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=gqa))
            continue
        kc = torch.cat([k.index_select(2, b.context), kb], dim=2)
        vc = torch.cat([v.index_select(2, b.context), vb], dim=2)
        n_ctx, n_own = b.context.numel(), b.end - b.start
        if n_ctx < n_own:
            # A masked call computes all n_own x (n_ctx + n_own) scores; the causal kernel skips the
            # upper triangle. With a short context it is cheaper to run causal over the whole path
            # with zero queries standing in for the context's rows, whose outputs are dropped.
            qp = torch.cat([qb.new_zeros(qb.shape[:2] + (n_ctx, qb.size(3))), qb], dim=2)
            out = F.scaled_dot_product_attention(qp, kc, vc, is_causal=True, scale=scale, enable_gqa=gqa)
            outs.append(out[:, :, n_ctx:])
            continue
        mask = layout.mask(n_own, n_ctx, q.device)
        outs.append(F.scaled_dot_product_attention(qb, kc, vc, attn_mask=mask, scale=scale, enable_gqa=gqa))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


class PositionedRotaryEmbedding(RotaryEmbedding):
    """Megatron's RoPE table, indexed by the stream layout's positions when one is active."""

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None):
        layout = _LAYOUT.get()
        if layout is None:
            return super().forward(max_seq_len, offset, packed_seq, cp_group)
        table = super().forward(int(layout.positions.max()) + 1, offset, packed_seq, cp_group)
        return table.index_select(0, layout.positions.to(table.device))  # [N, 1, 1, dim]


def use_positioned_rope(model: torch.nn.Module) -> None:
    """Make a built GPTModel's RoPE follow the stream layout (same parameters, same state dict)."""
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is not None and type(rope) is RotaryEmbedding:
        rope.__class__ = PositionedRotaryEmbedding
