"""Tensor-parallel layout of a Megatron GPTModel's state: shard a full state for one TP rank, gather
it back, and the TP-global gradient norm.

Full states are always the unpadded, TP-free Megatron state (``hf_mapping.hf_to_megatron``'s
names and shapes), so checkpoints are saved full and resharded at any TP. How each parameter is
split mirrors what Megatron's layers hold at tp > 1 (tests build a model at tp=2 and compare):
  * vocab-parallel (VocabParallelEmbedding, the output ColumnParallelLinear): dim 0, after padding
    the vocab rows with zeros to a multiple of tp (VocabParallelEmbedding needs vocab % tp == 0);
  * column-parallel ``linear_qkv``: dim 0; the fused GQA layout is per KV group, so contiguous
    chunks are whole KV groups (needs num_kv_heads % tp == 0);
  * column-parallel ``linear_fc1`` is gated: the full [gate; up] splits as [gate_r; up_r] per rank;
  * row-parallel ``linear_proj`` and ``linear_fc2``: dim 1;
  * layernorms: replicated. Qwen3's ``q_layernorm`` / ``k_layernorm`` (one head_dim weight shared
    by every head) are replicated too, but each rank's backward sees only its own heads, so their
    grads are partial sums that ``sum_partial_grads`` adds up over the TP group.
  * MoE routers and experts: replicated over TP (experts are split by expert parallelism instead,
    with expert tensor parallelism 1: ``seer.trainer.moe``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from seer.trainer.hf_mapping import HFArch


class Split(enum.Enum):
    """How one parameter is laid out across TP ranks."""

    REPLICATED = "replicated"  # every rank holds the full tensor
    VOCAB = "vocab"  # dim 0, vocab rows padded to a multiple of tp
    COLUMN = "column"  # dim 0 (output features)
    GATED = "gated"  # dim 0 of each half of [gate; up]
    ROW = "row"  # dim 1 (input features)


_SUFFIX_SPLITS: tuple[tuple[str, Split], ...] = (
    ("embedding.word_embeddings.weight", Split.VOCAB),
    ("output_layer.weight", Split.VOCAB),
    (".self_attention.linear_qkv.weight", Split.COLUMN),
    (".self_attention.linear_qkv.bias", Split.COLUMN),
    (".self_attention.linear_proj.weight", Split.ROW),
    (".mlp.linear_fc1.weight", Split.GATED),
    (".mlp.linear_fc2.weight", Split.ROW),
    ("layernorm.weight", Split.REPLICATED),  # input_, pre_mlp_, final_layernorm
    (".mlp.router.weight", Split.REPLICATED),
    (".linear_fc1.weight", Split.REPLICATED),  # MoE experts (.mlp.experts.local_experts.<e>.)
    (".linear_fc2.weight", Split.REPLICATED),
)

_SPLIT_DIM = {Split.VOCAB: 0, Split.COLUMN: 0, Split.GATED: 0, Split.ROW: 1}


def split_of(name: str) -> Split:
    """The TP layout of a Megatron parameter name; unknown names fail loudly, never replicate."""
    for suffix, split in _SUFFIX_SPLITS:
        if name.endswith(suffix):
            return split
    raise KeyError(f"no tensor-parallel layout known for parameter {name!r}")


def split_dim(name: str) -> int | None:
    """The dim a parameter is sharded on under TP, or None when it is replicated."""
    return _SPLIT_DIM.get(split_of(name))


_PARTIAL_GRAD_SUFFIXES = (".self_attention.q_layernorm.weight", ".self_attention.k_layernorm.weight")


def has_partial_grad(name: str) -> bool:
    """A replicated parameter applied to this rank's heads only: its grad is this rank's share."""
    return name.endswith(_PARTIAL_GRAD_SUFFIXES)


def is_tp_sharded(name: str) -> bool:
    """True when each TP rank holds a distinct part (Megatron's ``tensor_model_parallel``)."""
    return split_of(name) is not Split.REPLICATED


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """The smallest multiple of tp_size >= vocab_size (VocabParallelEmbedding's requirement)."""
    return -(-vocab_size // tp_size) * tp_size


def check_tp(arch: HFArch, tp_size: int) -> None:
    """Raise a clear error when the architecture cannot be split evenly over tp_size ranks."""
    if tp_size < 1:
        raise ValueError(f"tensor_parallel must be >= 1, not {tp_size}")
    if arch.num_kv_heads % tp_size:
        raise ValueError(f"tensor_parallel {tp_size} must divide num_kv_heads {arch.num_kv_heads}: "
                         "each rank holds whole KV groups (KV-head replication is not supported)")
    if arch.intermediate_size % tp_size:
        raise ValueError(f"tensor_parallel {tp_size} must divide intermediate_size {arch.intermediate_size}")


def _chunk(t: torch.Tensor, dim: int, tp_rank: int, tp_size: int) -> torch.Tensor:
    if t.shape[dim] % tp_size:
        raise ValueError(f"dim {dim} of shape {tuple(t.shape)} does not split into {tp_size} parts")
    return torch.chunk(t, tp_size, dim=dim)[tp_rank].contiguous()


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])], dim=0)


def shard_like(name: str, full: torch.Tensor, arch: HFArch, tp_rank: int, tp_size: int) -> torch.Tensor:
    """TP rank tp_rank's part of a full (unpadded) tensor laid out like parameter `name`.

    Works for anything with the parameter's shape (weights, grads, Adam's exp_avg / exp_avg_sq).
    """
    check_tp(arch, tp_size)
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is outside tensor_parallel {tp_size}")
    split = split_of(name)
    if split is Split.REPLICATED:
        return full
    if split is Split.VOCAB:
        if full.shape[0] != arch.vocab_size:
            raise ValueError(f"{name}: {full.shape[0]} rows, expected the unpadded vocab {arch.vocab_size}")
        return _chunk(_pad_rows(full, padded_vocab_size(arch.vocab_size, tp_size)), 0, tp_rank, tp_size)
    if split is Split.GATED:
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([_chunk(gate, 0, tp_rank, tp_size), _chunk(up, 0, tp_rank, tp_size)], dim=0)
    return _chunk(full, _SPLIT_DIM[split], tp_rank, tp_size)


def unshard(name: str, shards: Sequence[torch.Tensor], arch: HFArch) -> torch.Tensor:
    """Inverse of ``shard_like``: the full (unpadded) tensor from every TP rank's part, in rank order."""
    split = split_of(name)
    if split is Split.REPLICATED:
        return shards[0]
    if split is Split.VOCAB:
        return torch.cat(list(shards), dim=0)[: arch.vocab_size].contiguous()
    if split is Split.GATED:
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=_SPLIT_DIM[split])


def shard_state(full_state: Mapping[str, torch.Tensor], arch: HFArch, tp_rank: int, tp_size: int
                ) -> dict[str, torch.Tensor]:
    """TP rank tp_rank's state dict (names as GPTModel's) from the full Megatron state."""
    return {name: shard_like(name, t, arch, tp_rank, tp_size) for name, t in full_state.items()}


def _tp_group(tp_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    if tp_group is not None:
        return tp_group
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def gather_like(name: str, local: torch.Tensor, arch: HFArch, tp_group: dist.ProcessGroup | None = None
                ) -> torch.Tensor:
    """The full tensor laid out like parameter `name` from every TP rank's `local` part (a collective).

    Always a fresh tensor (replicated ones are copied), so it can snapshot grads that a later clip
    scales in place.
    """
    group = _tp_group(tp_group)
    size = dist.get_world_size(group)
    parts = [local.detach()]
    if size > 1 and is_tp_sharded(name):
        mine = parts[0].contiguous()
        parts = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(parts, mine, group=group)
    full = unshard(name, parts, arch)
    return full.clone() if full is parts[0] else full


def gather_state(local_state: Mapping[str, torch.Tensor], arch: HFArch,
                 tp_group: dist.ProcessGroup | None = None) -> dict[str, torch.Tensor]:
    """The full state on every rank of the TP group (a collective: every TP rank must call it).

    One all_gather per sharded tensor, in the mapping's order (GPTModel's, the same on every rank).
    Works for grads ({name: param.grad}) as well.
    """
    return {name: gather_like(name, t, arch, tp_group) for name, t in local_state.items()}


def optimizer_param_names(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[str]:
    """Parameter names in the index order of ``optimizer.state_dict()["state"]`` (groups, then params)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _per_param(value: object) -> bool:
    """An optimizer state entry laid out like its parameter (Adam's moments; not the 0-dim step)."""
    return isinstance(value, torch.Tensor) and value.ndim > 0


def gather_optimizer_state(optimizer_state: Mapping, param_names: Sequence[str], arch: HFArch,
                           tp_group: dist.ProcessGroup | None = None) -> dict:
    """A TP rank's ``optimizer.state_dict()`` with every per-parameter tensor made full (a collective).

    The result is TP-free, so a checkpoint saved from it loads at any TP via ``shard_optimizer_state``.
    """
    state = {}
    for idx in sorted(optimizer_state["state"]):
        entry = optimizer_state["state"][idx]
        full = {k: gather_like(param_names[idx], v, arch, tp_group) for k, v in sorted(entry.items()) if _per_param(v)}
        state[idx] = {**entry, **full}
    return {**optimizer_state, "state": state}


def shard_optimizer_state(full_state: Mapping, param_names: Sequence[str], arch: HFArch, tp_rank: int,
                          tp_size: int) -> dict:
    """Inverse of ``gather_optimizer_state`` for TP rank tp_rank (pure: no communication)."""
    state = {
        idx: {k: shard_like(param_names[idx], v, arch, tp_rank, tp_size) if _per_param(v) else v
              for k, v in entry.items()}
        for idx, entry in full_state["state"].items()
    }
    return {**full_state, "state": state}


def mark_tp_params(named_params: Iterable[tuple[str, torch.nn.Parameter]]) -> None:
    """Set Megatron's ``tensor_model_parallel`` / ``partition_dim`` / ``partition_stride`` on each param.

    Megatron only sets them while initialising weights, which ``perform_initialization=False``
    skips (biases excepted), so its own grad-norm and checkpoint utilities would see none sharded.
    """
    for name, p in named_params:
        dim = split_dim(name)
        p.tensor_model_parallel = dim is not None
        p.partition_dim = -1 if dim is None else dim
        p.partition_stride = 1


def sum_partial_grads(named_params: Iterable[tuple[str, torch.nn.Parameter]],
                      tp_group: dist.ProcessGroup | None = None) -> None:
    """All-reduce (sum) over the TP group the grads of replicated params used per head (QK-norm),
    so every rank holds the full grad, as Megatron's finalize_model_grads does. A collective."""
    all_reduce_grads([p.grad for name, p in named_params if has_partial_grad(name) and p.grad is not None],
                     _tp_group(tp_group))


def all_reduce_grads(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Sum `grads` in place over `group` in one collective (flattened: one message, not one per
    tensor). Nothing to do without grads or on a group of one."""
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    for g, summed in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(summed)


def tp_grad_norm(named_params: Iterable[tuple[str, torch.nn.Parameter]],
                 tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The global L2 norm of the grads under TP (a collective over the TP group).

    Sharded grads count on every rank, replicated ones (identical on every TP rank) only on TP
    rank 0; the sum of squares is all-reduced, so every rank gets the same norm.
    """
    group = _tp_group(tp_group)
    first_rank = dist.get_rank(group) == 0
    grads = [p.grad for name, p in named_params if p.grad is not None and (first_rank or is_tp_sharded(name))]
    device = grads[0].device if grads else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    total_sq = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        total_sq += torch.linalg.vector_norm(g.detach().float()) ** 2
    if dist.get_world_size(group) > 1:
        dist.all_reduce(total_sq, group=group)
    return total_sq.sqrt()


def clip_grad_norm_tp(named_params: Iterable[tuple[str, torch.nn.Parameter]], max_norm: float,
                      tp_group: dist.ProcessGroup | None = None) -> float:
    """``torch.nn.utils.clip_grad_norm_`` with the TP-global norm: the same coefficient on every rank.

    Returns the norm before clipping, as torch's does.
    """
    named_params = list(named_params)
    total = tp_grad_norm(named_params, tp_group)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for _, p in named_params:
        if p.grad is not None:
            p.grad.detach().mul_(coef.to(p.grad.device, p.grad.dtype))
    return float(total)
