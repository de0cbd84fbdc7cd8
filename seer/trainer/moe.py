"""Mixture-of-experts layers in the Megatron trainer: Qwen3-MoE's sparse MLP as Megatron's MoELayer.

What makes a Megatron MoE layer the same network as HF's ``Qwen3MoeSparseMoeBlock``:
  * the router is a bias-free linear computed in float32 (``moe_router_dtype="fp32"``), softmax
    scores; ``norm_topk_prob=True`` renormalises the top-k probabilities, which is Megatron's
    top-k-then-softmax (``moe_router_pre_softmax=False``); ``False`` keeps the full softmax's
    top-k values (``moe_router_pre_softmax=True``);
  * every expert is a SwiGLU MLP of ``moe_intermediate_size``: HF's per-expert gate_proj / up_proj
    stack into ``linear_fc1`` as [gate; up], down_proj is ``linear_fc2``;
  * which layers are sparse follows ``mlp_only_layers`` and ``decoder_sparse_step`` (Megatron's
    ``moe_layer_freq`` as a 0/1 list); Qwen3-MoE has no shared experts;
  * experts run one after another (Megatron's SequentialMLP): grouped GEMM needs GPU kernels
    (``moe_grouped_gemm`` with TransformerEngine or grouped_gemm), which this stack does not have.

The load-balancing loss is off unless ``trainer.moe_aux_loss_coef > 0`` (RL fine-tuning keeps the
pretrained balance, as verl and slime default). Routing replay (R3) and the per-iteration expert
load and router entropy live here as well; the Routing bytes themselves are ``seer.trainer.routing``'s.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

# ---- architecture ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MoEArch:
    """The MoE facts of a HF config.json."""

    num_experts: int
    top_k: int
    ffn_hidden_size: int  # moe_intermediate_size: each expert's SwiGLU width
    norm_topk_prob: bool
    layers: tuple[int, ...]  # indices of the sparse (MoE) decoder layers, in model order

    @classmethod
    def from_config(cls, cfg: dict, num_layers: int) -> MoEArch:
        """Qwen3-MoE's keys (transformers >= 5 writes ``num_local_experts`` for ``num_experts``)."""
        experts = cfg.get("num_experts", cfg.get("num_local_experts"))
        if not experts:
            raise NotImplementedError("a qwen3_moe config without num_experts is not supported")
        for key in ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts"):
            if cfg.get(key):
                raise NotImplementedError(f"shared experts ({key}) are not supported: Qwen3-MoE has none")
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense = set(cfg.get("mlp_only_layers") or [])
        layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
        top_k = int(cfg["num_experts_per_tok"])
        if not 1 <= top_k <= int(experts):
            raise NotImplementedError(f"num_experts_per_tok {top_k} must be within 1..{experts}")
        return cls(num_experts=int(experts), top_k=top_k, ffn_hidden_size=int(cfg["moe_intermediate_size"]),
                   norm_topk_prob=bool(cfg.get("norm_topk_prob", False)), layers=layers)


def config_kwargs(moe: MoEArch, num_layers: int, *, aux_loss_coef: float, expert_parallel: int,
                  routing_replay: bool) -> dict:
    """TransformerConfig fields of the MoE layers (merged into the dense model's config)."""
    return dict(
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.top_k,
        moe_ffn_hidden_size=moe.ffn_hidden_size,
        moe_layer_freq=[1 if i in moe.layers else 0 for i in range(num_layers)],
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not moe.norm_topk_prob,
        moe_router_dtype="fp32",  # the router's logits and top-k in float32, whatever the params' dtype
        moe_router_load_balancing_type="aux_loss" if aux_loss_coef > 0 else "none",
        moe_aux_loss_coeff=float(aux_loss_coef),
        moe_grouped_gemm=False,
        # allgather: every EP rank sees the EP group's tokens and returns its experts' outputs with a
        # reduce-scatter (gloo has all_gather_into_tensor and reduce_scatter_tensor). The alltoall
        # dispatcher sends fewer bytes at scale but creates CUDA streams when built (CPU cannot).
        moe_token_dispatcher_type="allgather",
        expert_model_parallel_size=expert_parallel,
        expert_tensor_parallel_size=1,
        moe_enable_routing_replay=routing_replay,
    )


def check_parallel(moe: MoEArch, tensor_parallel: int, expert_parallel: int) -> None:
    """Refuse layouts the MoE path does not implement, naming what is supported."""
    if tensor_parallel > 1:
        raise NotImplementedError("tensor_parallel > 1 with an MoE model is not supported: split the experts with "
                                  "trainer.expert_parallel and the batch with data_parallel")
    if moe.num_experts % expert_parallel:
        raise ValueError(f"trainer.expert_parallel {expert_parallel} must divide num_experts {moe.num_experts}")


def block_spec(dense_layer_spec, moe: MoEArch, num_layers: int):
    """Per-layer specs: the dense layer spec (attention, norms: whatever the family uses) with the
    MLP swapped for Megatron's MoE module (SequentialMLP experts) on the sparse layers."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec_for_backend
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    sparse = copy.deepcopy(dense_layer_spec)
    sparse.submodules.mlp = get_mlp_module_spec_for_backend(LocalSpecProvider(), num_experts=moe.num_experts,
                                                            moe_grouped_gemm=False)
    layers = [sparse if i in moe.layers else dense_layer_spec for i in range(num_layers)]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=LayerNormImpl)


def after_build(model: torch.nn.Module) -> None:
    """Take the model's routers off Megatron's process-wide replay list: Seer addresses each model's
    routers itself (``routers``), so a policy and its KL reference model never share replay state."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    mine = {id(r.router_replay) for r in routers(model) if r.router_replay is not None}
    RouterReplay.global_router_replay_instances[:] = [
        r for r in RouterReplay.global_router_replay_instances if id(r) not in mine
    ]


def routers(model: torch.nn.Module) -> list:
    """The model's MoE routers in layer order (one per sparse layer)."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for m in model.modules() if isinstance(m, TopKRouter)]


# ---- HF <-> Megatron ---------------------------------------------------------------------------


def hf_layer_to_megatron(hf: dict[str, torch.Tensor], h: str, m: str, moe: MoEArch) -> dict[str, torch.Tensor]:
    """One sparse layer's MLP: HF names under prefix `h` (``model.layers.i.``) -> Megatron's under `m`
    (global expert numbering: the EP-free full state)."""
    out = {m + "mlp.router.weight": hf[h + "mlp.gate.weight"]}
    for e in range(moe.num_experts):
        x, y = f"{h}mlp.experts.{e}.", f"{m}mlp.experts.local_experts.{e}."
        out[y + "linear_fc1.weight"] = torch.cat([hf[x + "gate_proj.weight"], hf[x + "up_proj.weight"]], 0)
        out[y + "linear_fc2.weight"] = hf[x + "down_proj.weight"]
    return out


def megatron_layer_to_hf(meg: dict[str, torch.Tensor], h: str, m: str, moe: MoEArch) -> dict[str, torch.Tensor]:
    """Inverse of ``hf_layer_to_megatron``."""
    out = {h + "mlp.gate.weight": meg[m + "mlp.router.weight"]}
    for e in range(moe.num_experts):
        x, y = f"{h}mlp.experts.{e}.", f"{m}mlp.experts.local_experts.{e}."
        gate, up = torch.chunk(meg[y + "linear_fc1.weight"], 2, dim=0)
        out[x + "gate_proj.weight"], out[x + "up_proj.weight"] = gate.contiguous(), up.contiguous()
        out[x + "down_proj.weight"] = meg[y + "linear_fc2.weight"]
    return out


# ---- routing replay (R3) -----------------------------------------------------------------------


def megatron_token_order(per_row: torch.Tensor) -> torch.Tensor:
    """[B, S, ...] -> [S * B, ...]: Megatron's MoE layers see hidden states [s, b, h] flattened s-major."""
    return per_row.transpose(0, 1).reshape(per_row.shape[0] * per_row.shape[1], *per_row.shape[2:])


@dataclass
class TokenSlots:
    """Where a micro-batch's sample tokens sit among the tokens its forward computes (Megatron's
    flattened order: [S * B] s-major for padded rows, the stream's [N] for packed/tree), so that
    router outputs are counted per sample token whatever the layout (a tree's shared prompt token
    stands for every sequence through it; a pad token, of a row or of an EP stream's pad block,
    for none)."""

    count_all: torch.Tensor  # [T] float: the sample tokens each forward token stands for
    count_read: torch.Tensor  # [T] float: the same without each sequence's last token (whose output no loss reads)
    slots: torch.Tensor  # [B, S-1] long: the forward token of row b's token j
    read: torch.Tensor  # [B, S-1] bool: row b's token j is real and not its last
    given: torch.Tensor | None  # [T, layers, top_k] the rollout's experts in forward order, or None

    @classmethod
    def of(cls, mb) -> TokenSlots:
        lengths = mb.lengths.cpu()
        b, width = mb.input_ids.shape
        j = torch.arange(width - 1).unsqueeze(0)
        read = j < (lengths - 1).unsqueeze(1)  # [B, S-1]
        if mb.stream is not None:
            n = mb.stream.input_ids.numel()
            slots = mb.stream.index.cpu()
            count_read = torch.bincount(slots[read], minlength=n).double()
            last = mb.stream.last.cpu()[lengths > 0]
            count_all = count_read + torch.bincount(last, minlength=n).double()
        else:
            pos = torch.arange(width).unsqueeze(0)
            count_all = megatron_token_order((pos < lengths.unsqueeze(1)).double())
            count_read = megatron_token_order((pos < (lengths - 1).unsqueeze(1)).double())
            slots = (j * b + torch.arange(b).unsqueeze(1)).expand(b, width - 1)
        given = None if mb.routing is None else megatron_token_order(mb.routing.cpu())
        return cls(count_all, count_read, slots, read, given)


@contextlib.contextmanager
def replay(model: torch.nn.Module, routing: torch.Tensor | None):
    """Within the block, every router of `model` picks the experts in `routing` ([B, S, layers,
    top_k], laid out like the forward's input: input_ids rows, or a stream's [1, N]) instead of
    its own top-k; the probabilities still come from the router's scores at those experts (so the
    router's gradient flows). None: the routers choose as usual."""
    if routing is None:
        yield
        return
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    rs = routers(model)
    if any(r.router_replay is None for r in rs):
        raise RuntimeError("routing replay needs a model built with trainer.routing_replay")
    if routing.shape[2] != len(rs):
        raise ValueError(f"routing has {routing.shape[2]} MoE layers, the model {len(rs)}")
    flat = megatron_token_order(routing)  # [S*B, layers, top_k]
    try:
        for layer, r in enumerate(rs):
            if flat.shape[-1] != r.topk:
                raise ValueError(f"routing has top-{flat.shape[-1]}, the model top-{r.topk}")
            r.router_replay.target_topk_idx = flat[:, layer].contiguous()
            r.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        yield
    finally:
        for r in rs:
            r.router_replay.clear_indices()
            r.router_replay.clear_router_replay_action()


# ---- metrics -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """What one forward of the policy adds to its RouterStats."""

    load: bool = False  # expert load and router entropy (the training forwards)
    differ: bool = False  # own top-k vs the rollout's experts: only on the weights that sampled (pre-update)
    record: bool = False  # keep the experts used per forward token (trainer.routing_record_dir)


class RouterStats:
    """Per-iteration expert load, router entropy and routing disagreement, per sample token.

    Forward hooks on the routers read each token's chosen experts (the routing map: the replayed
    ones under R3) and recompute the router's own float32 logits from its input, for the entropy
    and for its own top-k, which is compared with the rollout's experts where the micro-batch has
    them (``moe_routing_differ_*``: how far the trainer's router is from the engine's, whether or
    not replay then overrides it). The trainer opens ``micro_batch(slots, measure)`` around the
    forwards it wants counted, saying what each counts (``Measure``: the routers' own choice is
    compared only on the weights that sampled); with ``record`` the experts actually used are kept
    per forward token (``used``) for the replay check (trainer.routing_record_dir).
    """

    def __init__(self, model: torch.nn.Module, num_experts: int) -> None:
        self.num_experts = num_experts
        self.routers = routers(model)
        self._slots: TokenSlots | None = None
        self._measure = Measure()
        self.used: list[torch.Tensor | None] = [None] * len(self.routers)
        self.reset()
        self._hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def reset(self) -> None:
        n = len(self.routers)
        self.load = torch.zeros(n, self.num_experts, dtype=torch.float64)
        self.entropy_sum = torch.zeros(n, dtype=torch.float64)
        self.tokens = torch.zeros(n, dtype=torch.float64)
        # [tokens compared, tokens differing in any layer, (token, layer) decisions differing]
        self.differ = torch.zeros(3, dtype=torch.float64)
        self._any: torch.Tensor | None = None

    def _hook(self, layer: int):
        def hook(router, inputs, output):
            slots, measure = self._slots, self._measure
            if slots is None:
                return
            with torch.no_grad():
                hidden = inputs[0]
                logits = hidden.reshape(-1, hidden.shape[-1]).float() @ router.weight.float().t()
                routing_map = output[1].detach().cpu()
                if measure.load:
                    p = torch.softmax(logits, dim=-1)
                    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
                    w = slots.count_all
                    self.load[layer] += (routing_map.double() * w.unsqueeze(1)).sum(0)
                    self.entropy_sum[layer] += float((ent.double().cpu() * w).sum())
                    self.tokens[layer] += float(w.sum())
                if measure.differ and slots.given is not None:
                    k = slots.given.shape[-1]
                    own = logits.topk(k, dim=-1).indices.sort(-1).values.cpu()
                    rollout = slots.given[:, layer].sort(-1).values
                    differs = (own != rollout).any(-1)
                    self.differ[2] += float((differs.double() * slots.count_read).sum())
                    self._any = differs if self._any is None else self._any | differs
                if measure.record:
                    k = int(routing_map[0].sum()) if routing_map.shape[0] else 0
                    self.used[layer] = routing_map.nonzero()[:, 1].view(-1, k)
        return hook

    @contextlib.contextmanager
    def micro_batch(self, slots: TokenSlots, measure: Measure):
        """Count the forward inside the block (of the micro-batch `slots` describes) as `measure` says."""
        self._slots, self._measure, self._any = slots, measure, None
        self.used = [None] * len(self.routers)
        try:
            yield
        finally:
            if self._any is not None:
                self.differ[0] += float(slots.count_read.sum())
                self.differ[1] += float((self._any.double() * slots.count_read).sum())
            self._slots, self._measure, self._any = None, Measure(), None

    def all_reduce(self, group) -> None:
        import torch.distributed as dist

        flat = torch.cat([self.load.flatten(), self.entropy_sum, self.tokens, self.differ])
        dist.all_reduce(flat, group=group)
        n, e = self.load.shape
        self.load = flat[: n * e].view(n, e).clone()
        self.entropy_sum, self.tokens = flat[n * e: n * e + n].clone(), flat[n * e + n: n * e + 2 * n].clone()
        self.differ = flat[n * e + 2 * n:].clone()

    def summary(self) -> dict:
        """``moe_expert_load``: per MoE layer, each expert's share of the token-expert assignments;
        ``moe_load_max``: the busiest expert's share over the uniform share (1 = balanced), worst
        layer; ``moe_router_entropy``: mean entropy (nats) of the router's softmax per token.
        Where the samples carry the rollout's routing: ``moe_routing_differ_tokens``, the share of
        trained tokens (every token whose output the trainer reads: all but each sequence's last)
        whose own top-k differs from the rollout's in at least one MoE layer, and
        ``moe_routing_differ_decisions``, the share of (token, layer) router decisions that differ
        (expert sets compared; the router's own choice, before any replay overrides it)."""
        tokens = self.tokens.clamp_min(1)
        share = self.load / self.load.sum(1, keepdim=True).clamp_min(1)
        out = {
            "moe_expert_load": [[round(float(x), 5) for x in row] for row in share],
            "moe_load_max": float((share.max(1).values * self.num_experts).max()) if len(share) else float("nan"),
            "moe_router_entropy": float((self.entropy_sum / tokens).mean()) if len(share) else float("nan"),
        }
        compared = float(self.differ[0])
        if compared > 0:
            out["moe_routing_differ_tokens"] = float(self.differ[1]) / compared
            out["moe_routing_differ_decisions"] = float(self.differ[2]) / (compared * len(self.routers))
        return out


# ---- expert parallelism: the EP-free full state <-> this rank's experts -------------------------

_EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)(\..+)$")


def is_expert_param(name: str) -> bool:
    """An expert's weight: split over expert-parallel ranks, reduced over expert-data-parallel ones."""
    return _EXPERT.match(name) is not None


def ep_local_state(full: Mapping[str, torch.Tensor], num_experts: int, ep_rank: int, ep_size: int
                   ) -> dict[str, torch.Tensor]:
    """EP rank ep_rank's part of a full state (global expert numbers) under its local numbers:
    rank r holds experts [r * E/ep, (r+1) * E/ep), as Megatron assigns them."""
    per = num_experts // ep_size
    out = {}
    for name, t in full.items():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = t
        elif ep_rank * per <= int(m[2]) < (ep_rank + 1) * per:
            out[f"{m[1]}{int(m[2]) - ep_rank * per}{m[3]}"] = t
    return out


def ep_full_names(name: str, num_experts: int, ep_size: int) -> list[str]:
    """The global names of local parameter `name` on every EP rank (itself when not an expert's)."""
    m = _EXPERT.match(name)
    if m is None:
        return [name]
    per = num_experts // ep_size
    return [f"{m[1]}{r * per + int(m[2])}{m[3]}" for r in range(ep_size)]


def ep_full_state(local: Mapping[str, torch.Tensor], group) -> dict[str, torch.Tensor]:
    """Inverse of ``ep_local_state`` on every rank of the EP group (a collective: one all_gather per
    expert tensor, in the mapping's order, which is the model's on every rank)."""
    import torch.distributed as dist

    size = dist.get_world_size(group)
    per = None
    out = {}
    for name, t in local.items():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = t
            continue
        if per is None:
            per = 1 + max(int(_EXPERT.match(n)[2]) for n in local if _EXPERT.match(n))
        mine = t.detach().contiguous()
        parts = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(parts, mine, group=group)
        for r, part in enumerate(parts):
            out[f"{m[1]}{r * per + int(m[2])}{m[3]}"] = part
    return out


def dummy_micro_batch(device, stream: bool = False):
    """A micro-batch that trains nothing (mask 0, no real tokens): under expert parallelism every
    rank of an EP group must run as many forwards and backwards as its peers, since each MoE
    layer exchanges tokens with them, so a rank with fewer micro-batches runs these. `stream`: a
    packed/tree one (no tokens yet: ``pad_micro_batch`` grows it to its peers' stream)."""
    from seer.trainer.batching import MicroBatch

    ids = torch.zeros(1, 2, dtype=torch.long)
    mb = MicroBatch(indices=[], input_ids=ids, targets=ids[:, 1:].clone(), mask=torch.zeros(1, 1),
                    advantages=torch.zeros(1, 1), rollout_logprobs=torch.zeros(1, 1),
                    has_rollout_logprobs=torch.zeros(1, dtype=torch.bool), lengths=torch.zeros(1, dtype=torch.long))
    if stream:
        from seer.trainer.packing import Stream

        mb.stream = Stream.empty(torch.device("cpu"))
    return mb.to(device)


def _grown(t: torch.Tensor, shape: tuple[int, ...], fill) -> torch.Tensor:
    """`t` in the top-left corner of a new tensor of `shape` (leading dims) filled with `fill`."""
    out = t.new_full((*shape, *t.shape[len(shape):]), fill)
    out[tuple(slice(0, n) for n in t.shape[: len(shape)])] = t
    return out


def _grown_routing(routing: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """[B, S, layers, top_k] routing grown to [rows, width] with filler experts 0..k-1 (any valid
    ids: the tokens there are padding, which trains nothing and which the router statistics skip)."""
    layers, k = routing.shape[2:]
    out = torch.arange(k, dtype=routing.dtype, device=routing.device).expand(rows, width, layers, k).clone()
    out[: routing.shape[0], : routing.shape[1]] = routing
    return out


def forward_shape(mb) -> tuple[int, int]:
    """The [b, s] a micro-batch's forward runs on: its padded rows, or a stream's [1, N]."""
    if mb.stream is not None:
        return 1, mb.stream.computed_tokens
    return tuple(mb.input_ids.shape)


def pad_micro_batch(mb, rows: int, width: int, pad_id: int = 0):
    """`mb` grown to forward [rows, width]: padded rows and columns (no real tokens, mask 0), or a
    stream (rows 1) grown by a pad block of its own (``packing.Stream.padded_to``); routing with
    filler ids where it grew."""
    from seer.trainer.batching import MicroBatch

    if forward_shape(mb) == (rows, width):
        return mb
    routing = None if mb.routing is None else _grown_routing(mb.routing, rows, width)
    if mb.stream is not None:
        if rows != 1:
            raise ValueError(f"a stream forwards one row, not {rows}")
        return replace(mb, stream=mb.stream.padded_to(width, pad_id), routing=routing)
    input_ids = _grown(mb.input_ids, (rows, width), pad_id)
    per_token = (rows, width - 1)
    return MicroBatch(
        indices=mb.indices, input_ids=input_ids, targets=input_ids[:, 1:].clone(), mask=_grown(mb.mask, per_token, 0.0),
        advantages=_grown(mb.advantages, (rows,), 0.0), rollout_logprobs=_grown(mb.rollout_logprobs, per_token, 0.0),
        has_rollout_logprobs=_grown(mb.has_rollout_logprobs, (rows,), False),
        lengths=None if mb.lengths is None else _grown(mb.lengths, (rows,), 0), routing=routing,
    )


def equalize_micro_batches(mbs: list, group, device, pad_id: int = 0, stream: bool = False) -> list:
    """Under expert parallelism every rank of an EP group must run as many MoE forwards as its
    peers, each with as many tokens (the allgather dispatcher gathers equal-sized blocks): `mbs`
    is padded with ``dummy_micro_batch`` to the group's most micro-batches and each one to the
    group's largest forward shape of that index (two collectives): [rows, width] for padded
    micro-batches, the longest stream for packed/tree ones (`stream`). Padding trains nothing."""
    import torch.distributed as dist

    count = torch.tensor([len(mbs)], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    mbs = list(mbs) + [dummy_micro_batch(device, stream) for _ in range(int(count[0]) - len(mbs))]
    shapes = torch.tensor([forward_shape(mb) for mb in mbs], dtype=torch.int64).view(-1, 2)
    dist.all_reduce(shapes, op=dist.ReduceOp.MAX, group=group)
    return [pad_micro_batch(mb, int(r), int(w), pad_id) for mb, (r, w) in zip(mbs, shapes.tolist())]


def forward_scope(model: torch.nn.Module, mb, *, replay_on: bool, stats: RouterStats | None,
                  measure: Measure = Measure()):
    """The context a forward of an MoE model runs in: routing replay from ``mb.routing`` when on,
    router statistics as `measure` says when `stats` is given (the policy's forwards)."""
    stack = contextlib.ExitStack()
    if replay_on:
        real = mb.lengths is None or int(mb.lengths.sum()) > 0
        if mb.routing is None and real:
            raise ValueError("trainer.routing_replay is on but a sequence has no routing (Sample.routing): the "
                             "rollout must capture the experts it chose")
        stack.enter_context(replay(model, mb.routing))
    if stats is not None and mb.lengths is not None and measure != Measure():
        stack.enter_context(stats.micro_batch(TokenSlots.of(mb), measure))
    return stack


def clip_grad_norm_ep(named_params, max_norm: float, ep_group) -> float:
    """Clip by the global norm under expert parallelism (tensor parallel 1): the replicated (dense)
    grads counted once, every rank's own experts summed over the EP group. Returns the norm before
    clipping, as torch's does."""
    import torch.distributed as dist

    named_params = [(n, p) for n, p in named_params if p.grad is not None]
    dense = sum((torch.linalg.vector_norm(p.grad.detach().float()) ** 2 for n, p in named_params
                 if not is_expert_param(n)), torch.zeros((), dtype=torch.float32))
    experts = sum((torch.linalg.vector_norm(p.grad.detach().float()) ** 2 for n, p in named_params
                   if is_expert_param(n)), torch.zeros((), dtype=torch.float32))
    dist.all_reduce(experts, group=ep_group)
    total = (dense + experts).sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for _, p in named_params:
        p.grad.detach().mul_(coef.to(p.grad.device, p.grad.dtype))
    return float(total)
