"""Routing replay's data on the trainer side: a sample's `Routing` bytes as expert-id tensors, laid
out like the micro-batch's input_ids (importable without Megatron; docs/extending.md).

`Routing.data` is tokens x layers x top_k ids, row-major, aligned with prompt_ids + response_ids.
Every token layout the trainer uses (padded today; packed or tree later) gathers the routing with
the same (sequence, token) indices it gathers input_ids with: ``gather_routing`` is that one
function, and ``padded_routing`` is its call for the padded layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from seer.types import Routing

_NP_DTYPES = {"uint8": np.uint8, "uint16": np.uint16}


def routing_tensor(routing: Routing) -> torch.Tensor:
    """[tokens, layers, top_k] int64 expert ids of one sample."""
    if routing.dtype not in _NP_DTYPES:
        raise ValueError(f"routing dtype {routing.dtype!r} is not uint8 or uint16")
    ids = np.frombuffer(routing.data, dtype=_NP_DTYPES[routing.dtype])
    width = routing.layers * routing.top_k
    if width == 0 or ids.size % width:
        raise ValueError(f"routing data of {ids.size} ids is not a whole number of tokens x {routing.layers} "
                         f"layers x {routing.top_k}")
    return torch.from_numpy(ids.astype(np.int64)).view(-1, routing.layers, routing.top_k)


def routing_from_tensor(ids: torch.Tensor, num_experts: int) -> Routing:
    """The compact record of [tokens, layers, top_k] expert ids (uint8 up to 256 experts)."""
    dtype = "uint8" if num_experts <= 256 else "uint16"
    tokens, layers, top_k = ids.shape
    data = ids.to(torch.int64).numpy().astype(_NP_DTYPES[dtype]).tobytes()
    return Routing(layers=layers, top_k=top_k, dtype=dtype, data=data)


def gather_routing(routings: Sequence[Routing], seq_index: torch.Tensor, token_index: torch.Tensor,
                   layers: int, top_k: int) -> torch.Tensor:
    """Expert ids at each slot of a token layout: slot (i) holds token ``token_index[i]`` of
    sequence ``seq_index[i]`` (index into `routings`), or is padding where seq_index is -1.

    Returns [*seq_index.shape, layers, top_k] int64. Padding gets ids 0..top_k-1 (any valid,
    distinct ids: padded positions are masked out of every loss). Raises when a sequence's routing
    does not cover the tokens asked for or has another shape than the model's MoE layers.
    """
    tensors = []
    for n, r in enumerate(routings):
        t = routing_tensor(r)
        if t.shape[1:] != (layers, top_k):
            raise ValueError(f"sequence {n}: routing of {t.shape[1]} layers x top-{t.shape[2]}, the model has "
                             f"{layers} MoE layers x top-{top_k}")
        tensors.append(t)
    out = torch.arange(top_k, dtype=torch.int64).expand(*seq_index.shape, layers, top_k).clone()
    real = seq_index >= 0
    for n, t in enumerate(tensors):
        where = real & (seq_index == n)
        if not bool(where.any()):
            continue
        tok = token_index[where]
        if int(tok.max()) >= t.shape[0]:
            raise ValueError(f"sequence {n}: routing covers {t.shape[0]} tokens, the layout needs token {int(tok.max())}")
        out[where] = t[tok]
    return out


def padded_routing(routings: Sequence[Routing], lengths: Sequence[int], width: int, layers: int,
                   top_k: int) -> torch.Tensor:
    """[B, width, layers, top_k] for right-padded rows (row b holds sequence b's first lengths[b] tokens).

    A routing may stop one token short: the engine never runs the last sampled token through the
    model, and the trainer uses no output of that position (its logits predict nothing), so it is
    filled like padding.
    """
    b = len(routings)
    covered = [min(n, r.num_tokens) for n, r in zip(lengths, routings, strict=True)]
    short = [i for i, (n, c) in enumerate(zip(lengths, covered)) if c < n - 1]
    if short:
        i = short[0]
        raise ValueError(f"sequence {i}: routing covers {covered[i]} tokens of {lengths[i]} (at least all but the "
                         "last are needed)")
    pos = torch.arange(width).expand(b, width)
    seq = torch.arange(b).unsqueeze(1).expand(b, width).clone()
    seq[pos >= torch.tensor(covered).unsqueeze(1)] = -1
    return gather_routing(routings, seq, pos, layers, top_k)
