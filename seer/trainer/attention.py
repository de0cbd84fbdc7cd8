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
    _paths: dict = field(default_factory=dict, repr=False)

    def to(self, device: torch.device) -> StreamLayout:
        blocks = [Block(b.start, b.end, None if b.context is None else b.context.to(device)) for b in self.blocks]
        return StreamLayout(self.positions.to(device), blocks)

    @property
    def sizes(self) -> list[int]:
        return [b.end - b.start for b in self.blocks]

    @property
    def has_context(self) -> bool:
        return any(b.context is not None and b.context.numel() for b in self.blocks)

    def mask(self, n_q: int, n_ctx: int, device: torch.device) -> torch.Tensor:
        """[n_q, n_ctx + n_q] bool, True = attend: every context token, and causal within the block."""
        key = (n_q, n_ctx, device)
        if key not in self._masks:
            self._masks[key] = torch.ones(n_q, n_ctx + n_q, dtype=torch.bool, device=device).tril(n_ctx)
        return self._masks[key]

    def paths(self, device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """Every block's key/value path (context, then its own tokens) as one stream index, and each
        path's length: keys and values are gathered in one index_select per layer, whose backward is
        one scatter (a gather per block would build a stream-sized zero gradient per block)."""
        if device not in self._paths:
            parts, sizes = [], []
            for b in self.blocks:
                own = torch.arange(b.start, b.end, device=device)
                parts.append(own if b.context is None else torch.cat([b.context.to(device), own]))
                sizes.append(parts[-1].numel())
            self._paths[device] = (torch.cat(parts), sizes)
        return self._paths[device]


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
    """q [1, heads, N, d], k/v [1, kv_heads, N, d] -> [1, heads, N, d], one SDPA call per block.

    Queries are split into blocks (the backward concatenates once), never sliced one block at a time:
    each slice's backward would write a stream-sized gradient, O(N x blocks) per layer."""
    gqa = k.size(1) != q.size(1)
    sizes = layout.sizes
    qs = q.split(sizes, dim=2)
    if not layout.has_context:  # packed: every block is a whole sequence, causal on its own
        outs = [F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=gqa)
                for qb, kb, vb in zip(qs, k.split(sizes, dim=2), v.split(sizes, dim=2))]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    index, path_sizes = layout.paths(q.device)
    ks, vs = k.index_select(2, index).split(path_sizes, dim=2), v.index_select(2, index).split(path_sizes, dim=2)
    outs = []
    for b, qb, kc, vc in zip(layout.blocks, qs, ks, vs):
        n_own = b.end - b.start
        n_ctx = kc.size(2) - n_own
        if n_ctx == 0:
            outs.append(F.scaled_dot_product_attention(qb, kc, vc, is_causal=True, scale=scale, enable_gqa=gqa))
        elif n_ctx < n_own:
            # A masked call computes all n_own x (n_ctx + n_own) scores; the causal kernel skips the
            # upper triangle. With a short context it is cheaper to run causal over the whole path
            # with zero queries standing in for the context's rows, whose outputs are dropped.
            qp = torch.cat([qb.new_zeros(qb.shape[:2] + (n_ctx, qb.size(3))), qb], dim=2)
            out = F.scaled_dot_product_attention(qp, kc, vc, is_causal=True, scale=scale, enable_gqa=gqa)
            outs.append(out[:, :, n_ctx:])
        else:
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
