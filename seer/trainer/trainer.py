"""The GRPO trainer: one ``train_step`` per rollout iteration on a Megatron-core GPTModel.

Seer is strictly synchronous: the batch handed to ``train_step`` was sampled by exactly the weights
the trainer holds now. The step therefore measures the train-inference log-prob mismatch on those
(pre-update) weights, then updates. With one mini-batch and recomputed old log-probs, the old
log-probs are the detached log-probs of the training forward itself (same weights, same tokens),
so no extra forward pass is spent on them.
"""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from seer.types import RolloutBatch
from seer.trainer import losses, moe, packing, tp_shard
from seer.trainer.algorithms import Algorithms
from seer.trainer.config import TrainerConfig
from seer.trainer.metrics import TrainMetrics
from seer.trainer.batching import MicroBatch, TrainSequence, make_micro_batches, response_logprobs, shard_by_tokens
from seer.trainer.distributed import device as default_device
from seer.trainer.distributed import RankPlace, init_megatron
from seer.trainer.export import atomic_write_bytes, checkpoint_files, write_hf_checkpoint
from seer.trainer.hf_mapping import HFArch
from seer.trainer.model import (build_gpt_model, forward_logits, forward_stream_logits, load_hf_weights,
                                megatron_weights_as_hf, read_hf_state_dict)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECKPOINT_FILE = "trainer_state.pt"
CHECKPOINT_FORMAT = 2  # full (unsharded) tensors by parameter name: resumable at any world size
_SUMMED = ("pg_loss", "clipfrac", "entropy", "ratio", "kl", "computed_tokens", "sample_tokens", "is_weight")


@dataclass(frozen=True)
class SFTExample:
    prompt_ids: list[int]
    response_ids: list[int]


class _Totals:
    """Token-weighted sums across micro-batches, for logging."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.sums: dict[str, float] = {}
        self.mismatch_sum = 0.0
        self.mismatch_tokens = 0.0
        self.mismatch_max = 0.0

    def add(self, name: str, per_token: torch.Tensor, mask: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float((per_token.detach() * mask).sum())

    def mean(self, name: str) -> float:
        return self.sums.get(name, 0.0) / self.tokens if self.tokens else 0.0

    @property
    def mismatch_mean(self) -> float:
        return self.mismatch_sum / self.mismatch_tokens if self.mismatch_tokens else float("nan")

    def all_reduce(self, group, objective: float) -> float:
        """Sum (max for the mismatch max) over the data-parallel ranks; returns the summed objective."""
        sums = torch.tensor([self.tokens, self.mismatch_sum, self.mismatch_tokens, objective,
                             *(self.sums.get(k, 0.0) for k in _SUMMED)], dtype=torch.float64)
        dist.all_reduce(sums, group=group)
        peak = torch.tensor([self.mismatch_max], dtype=torch.float64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        self.tokens, self.mismatch_sum, self.mismatch_tokens, objective = (float(x) for x in sums[:4])
        self.sums = {k: float(v) for k, v in zip(_SUMMED, sums[4:])}
        self.mismatch_max = float(peak[0])
        return objective

    def add_mismatch(self, mb: MicroBatch, recomputed: torch.Tensor) -> None:
        m = mb.mask * mb.has_rollout_logprobs.unsqueeze(1).to(mb.mask.dtype)
        if m.sum() == 0:
            return
        diff = (recomputed.detach() - mb.rollout_logprobs).abs() * m
        self.mismatch_sum += float(diff.sum())
        self.mismatch_tokens += float(m.sum())
        self.mismatch_max = max(self.mismatch_max, float(diff.max()))


def _checked_routing(s, replay: bool):
    """A sample's routing as the trainer takes it: one row per prompt + response token, or an error
    (a misaligned replay would route every later token wrongly, silently). Without replay a routing
    the sample carries is kept where it lines up (the routing-difference metrics read it)."""
    r = s.routing
    want = len(s.prompt.prompt_ids) + len(s.response_ids)
    if not replay:
        return r if r is not None and r.num_tokens == want else None
    if r is None or r.num_tokens != want:
        raise ValueError(f"trainer.routing_replay: sample {s.request_id} has routing for "
                         f"{None if r is None else r.num_tokens} tokens, not its {want} prompt + response tokens")
    return r


class Trainer:
    """Megatron-core policy + AdamW, loaded from and exported to HF checkpoints.

    ``iteration`` counts completed updates (``train_step`` / ``sft_step`` calls): it is the weight
    version of the weights held now, and what ``load_checkpoint`` returns for --resume.
    """

    def __init__(self, hf_path: str | Path, config: TrainerConfig | None = None, place: RankPlace | None = None) -> None:
        self.config = config or TrainerConfig()
        self.place = place or RankPlace()
        self.hf_path = Path(hf_path)
        init_megatron(self.config.seed, self.place)
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_group = parallel_state.get_data_parallel_group() if self.dp_size > 1 else None
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.ep_size = parallel_state.get_expert_model_parallel_world_size()
        self.device = default_device()
        self.dtype = _DTYPES[self.config.params_dtype]
        self.arch = HFArch.from_dir(self.hf_path)
        if self.arch.moe is None and (self.config.routing_replay or self.ep_size > 1):
            raise ValueError(f"trainer.routing_replay and expert_parallel need an MoE model, not {self.arch.model_type!r}")
        hf_state = read_hf_state_dict(self.hf_path)
        self.model = self._build(hf_state)
        self.ref_model = None  # the initial weights, frozen (also after a resume)
        if self.config.kl_coef > 0:
            self.ref_model = self._build(hf_state).eval().requires_grad_(False)
        # expert load and router entropy of the policy's training forwards (MoE models)
        self.router_stats = moe.RouterStats(self.model, self.arch.moe.num_experts) if self.arch.moe else None
        named = list(self.model.named_parameters())
        decay = [(n, p) for n, p in named if p.ndim >= 2]
        no_decay = [(n, p) for n, p in named if p.ndim < 2]
        self._param_names = [n for n, _ in decay + no_decay]  # the optimizer's parameter order
        self.optimizer = torch.optim.AdamW(
            [{"params": [p for _, p in decay], "weight_decay": self.config.weight_decay},
             {"params": [p for _, p in no_decay], "weight_decay": 0.0}],
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
        )
        self.algorithms = Algorithms.from_config(self.config)  # seer.trainer.algorithms: the registry's choices
        self.iteration = 0
        self.captured_grads: list[dict[str, torch.Tensor]] | None = None  # a list: keep each step's reduced gradients

    @property
    def is_writer(self) -> bool:
        """The rank that writes exports and checkpoints (every rank holds or gathers the same)."""
        return self.place.rank == 0

    @property
    def gathers_for_writer(self) -> bool:
        """Whether this rank takes part in what the writer exports: rank 0's tensor-parallel group
        (data-parallel replica 0) gathers the shards; the other replicas hold copies and do nothing.
        Under expert parallelism the experts are spread over data-parallel ranks: every rank gathers
        (each in its own EP group)."""
        return self.dp_rank == 0 or self.ep_size > 1

    def join_export(self) -> None:
        """A non-writing rank's part in an export: its shards gathered with the writer's (no files)."""
        if self.gathers_for_writer and (self.tp_size > 1 or self.ep_size > 1):
            self.hf_state_dict()

    def _build(self, hf_state: dict[str, torch.Tensor]) -> torch.nn.Module:
        model = build_gpt_model(self.arch, self.dtype, moe_aux_loss_coef=self.config.moe_aux_loss_coef,
                                routing_replay=self.config.routing_replay)
        load_hf_weights(model, hf_state, self.arch)  # this rank's shard under tensor parallelism
        return model.to(self.device)

    # ---- this rank's share of full tensors (identity at tensor_parallel 1) -----------------

    def _local_state(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.ep_size > 1:
            full = moe.ep_local_state(full, self.arch.moe.num_experts, parallel_state.get_expert_model_parallel_rank(),
                                      self.ep_size)
        if self.tp_size == 1:
            return full
        return tp_shard.shard_state(full, self.arch, parallel_state.get_tensor_model_parallel_rank(), self.tp_size)

    def _full_state(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full tensors from this rank's shards (a collective over the tensor- and expert-parallel groups)."""
        if self.ep_size > 1:
            local = moe.ep_full_state(local, parallel_state.get_expert_model_parallel_group())
        return local if self.tp_size == 1 else tp_shard.gather_state(local, self.arch)

    def _full_names(self, name: str) -> list[str]:
        """The full-state names of a local parameter: itself, or under expert parallelism every EP
        rank's expert at this local number."""
        if self.ep_size == 1:
            return [name]
        return moe.ep_full_names(name, self.arch.moe.num_experts, self.ep_size)

    def _model_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.model.state_dict().items()
                if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}

    # ---- data-parallel reductions ----------------------------------------------------------

    def _my_share(self, items: list, lengths: list[int]) -> list:
        """This data-parallel rank's shard of `items`, balanced by tokens (all of them at dp 1)."""
        if self.dp_size == 1:
            return list(items)
        return [items[i] for i in shard_by_tokens(lengths, self.dp_size)[self.dp_rank]]

    def _mini_batches(self, seqs: list[TrainSequence], n_mini: int) -> list[list[TrainSequence]]:
        """trainer.mini_batch_split: whole groups per mini-batch (by shared prefix, balanced by
        tokens), or every n-th sequence. The same split under every batch_layout: layouts stay equal."""
        if self.config.mini_batch_split == "strided":
            return [seqs[k::n_mini] for k in range(n_mini)]
        return [[seqs[i] for i in part] for part in packing.split_mini_batches(seqs, n_mini)]

    def _shard(self, seqs: list[TrainSequence]) -> list[TrainSequence]:
        """This rank's sequences: balanced by compute with attention counted (tree/packed: the
        trie's new tokens per sequence, so a group's shared prompt stays on one rank), or by tokens."""
        if self.dp_size == 1 or self.config.batch_layout == "padded":
            return self._my_share(seqs, [s.length for s in seqs])
        shards = packing.shard_streams(seqs, self.dp_size, self.config.batch_layout == "tree",
                                       packing.CostModel.for_arch(self.arch))
        return [seqs[i] for i in shards[self.dp_rank]]

    def _reduce_grads(self) -> None:
        """Sum the gradients over the data-parallel ranks (each loss is already normalised by the
        global token count); a rank whose shard was empty contributes zeros. Under tensor
        parallelism QK-norm grads are first summed over the heads' ranks."""
        if self.tp_size > 1:
            tp_shard.sum_partial_grads(self.model.named_parameters())
        if self.dp_size == 1:
            return
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        for _, p in named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # Under expert parallelism a rank's experts are its own: their grads (which the token
        # exchange already summed over the EP group) are reduced over the expert-data-parallel ranks.
        expert_group = parallel_state.get_expert_data_parallel_group() if self.ep_size > 1 else self.dp_group
        for group, want_expert in ((self.dp_group, False), (expert_group, True)):
            tp_shard.all_reduce_grads(
                [p.grad for n, p in named if (self.ep_size > 1 and moe.is_expert_param(n)) == want_expert], group)

    def _clip_grads(self) -> float:
        """Clip by the global norm: over the whole model, its tensor-parallel shards counted once."""
        if self.ep_size > 1:
            return moe.clip_grad_norm_ep(self.model.named_parameters(), self.config.max_grad_norm,
                                         parallel_state.get_expert_model_parallel_group())
        if self.tp_size == 1:
            return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm))
        return tp_shard.clip_grad_norm_tp(self.model.named_parameters(), self.config.max_grad_norm)

    # ---- forward helpers -------------------------------------------------------------------

    def _moe_scope(self, model: torch.nn.Module, mb: MicroBatch, measure: moe.Measure | None):
        """Routing replay and router statistics around one forward of an MoE model (`measure`: what
        a forward of the policy counts; None: nothing)."""
        if self.arch.moe is None:
            return contextlib.nullcontext()
        stats = self.router_stats if model is self.model and measure is not None else None
        return moe.forward_scope(model, mb, replay_on=self.config.routing_replay, stats=stats,
                                 measure=measure or moe.Measure())

    def _micro_batches(self, seqs: list[TrainSequence]) -> list[MicroBatch]:
        """Every rank calls this once per batch it forwards, even with no sequences (under expert
        parallelism the ranks of an EP group run equally many micro-batches)."""
        cfg = self.config
        if cfg.batch_layout == "padded":
            mbs = make_micro_batches(seqs, cfg.max_tokens_per_micro_batch, cfg.pad_token_id)
        else:
            mbs = packing.make_stream_micro_batches(seqs, cfg.max_tokens_per_micro_batch, cfg.batch_layout == "tree",
                                                    cfg.pad_token_id)
        mbs = [mb.to(self.device) for mb in mbs]
        if self.ep_size > 1:
            mbs = moe.equalize_micro_batches(mbs, parallel_state.get_expert_model_parallel_group(), self.device,
                                             cfg.pad_token_id, stream=cfg.batch_layout != "padded")
        return mbs

    def _token_stats(self, model: torch.nn.Module, mb: MicroBatch, entropy: str | None = None,
                     measure: moe.Measure | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs [B, S-1] (and entropy: None, "detached" or "grad") in the padded
        per-sequence layout, whichever layout the forward computed them in."""
        t = self.config.temperature
        if mb.stream is not None:
            with self._moe_scope(model, mb, measure):
                logits = forward_stream_logits(model, mb.stream.input_ids, mb.stream.layout)
            return packing.stream_token_stats(logits, mb.stream, mb.targets, t, entropy)
        with self._moe_scope(model, mb, measure):
            logits = forward_logits(model, mb.input_ids)[:, :-1]
        ent = None
        if entropy is not None:
            ent = losses.entropy_from_logits(logits if entropy == "grad" else logits.detach(), t)
        return losses.token_logprobs(logits, mb.targets, t), ent

    @staticmethod
    def _computed_tokens(mb: MicroBatch) -> int:
        return mb.stream.computed_tokens if mb.stream is not None else mb.input_ids.numel()

    @torch.no_grad()
    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """Log-probs of each response token under the current weights (no update)."""
        seqs = [TrainSequence(p, r) for p, r in zip(prompts, responses, strict=True)]
        out: list[list[float]] = [[] for _ in seqs]
        self.model.eval()
        for mb in self._micro_batches(seqs):
            lp, _ = self._token_stats(self.model, mb)
            for row, i in enumerate(mb.indices):
                out[i] = lp[row][mb.mask[row].bool()].tolist()
        return out

    # ---- GRPO ------------------------------------------------------------------------------

    def sequences_from_batch(self, batch: RolloutBatch) -> list[TrainSequence]:
        """Samples -> TrainSequences with the configured advantages (missing rewards count as 0)."""
        groups = batch.train_groups()  # a system failure's samples are no samples of the policy
        samples = [s for group in groups for s in group]
        adv = [a for group in self.algorithms.advantages(groups) for a in group]  # trainer.advantage_estimator
        return [
            TrainSequence(
                prompt_ids=list(s.prompt.prompt_ids),
                response_ids=list(s.response_ids),
                advantage=float(a),
                rollout_logprobs=response_logprobs(s.logprobs, s.loss_mask, len(s.response_ids)),
                loss_mask=list(s.loss_mask) if s.loss_mask is not None else None,
                # prompt + response rows, in the order of prompt_ids + response_ids (multi-turn:
                # response_ids holds the observations too, with their rows from the next prefill)
                routing=_checked_routing(s, self.config.routing_replay),
            )
            for s, a in zip(samples, adv, strict=True)
            if s.response_ids
        ]

    def train_step(self, batch: RolloutBatch) -> TrainMetrics:
        return self.train_sequences(self.sequences_from_batch(batch))

    def train_sequences(self, seqs: list[TrainSequence]) -> TrainMetrics:
        """One GRPO update (``mini_batches`` optimizer steps) on sequences with advantages."""
        cfg = self.config
        t0 = time.perf_counter()
        if not seqs:
            raise ValueError("train_step got no sequences with response tokens")
        if cfg.old_logprobs == "rollout" and any(
            s.rollout_logprobs is None or len(s.rollout_logprobs) != len(s.response_ids) for s in seqs
        ):
            raise ValueError("old_logprobs='rollout' needs one rollout logprob per response token")
        n_mini = max(1, min(cfg.mini_batches, len(seqs)))
        minis = []  # (this rank's micro-batches, the mini-batch's global token and sequence counts)
        shards = []  # this rank's sequences of each mini-batch (what a micro-batch's indices point into)
        for mini in self._mini_batches(seqs, n_mini):
            mine = self._shard(mini)
            shards.append(mine)
            minis.append((self._micro_batches(mine) if mine or self.ep_size > 1 else [],
                          float(sum(s.trained_tokens for s in mini)),
                          float(sum(1 for s in mini if s.trained_tokens > 0))))
        used_routing: list[dict] = []  # trainer.routing_record_dir: the experts the routers used
        totals = _Totals()
        if self.router_stats is not None:
            self.router_stats.reset()

        # Old log-probs and the mismatch check for later mini-batches must see pre-update weights.
        self.model.eval()
        with torch.no_grad():
            for mbs, _, _ in minis[1:]:
                for mb in mbs:
                    # the weights that sampled: where the trainer's own routing is compared with the rollout's
                    lp = self._token_stats(self.model, mb, measure=moe.Measure(differ=True))[0]
                    self._set_old_logprobs(mb, lp, totals)

        self.model.train()
        grad_norms, objective = [], 0.0
        for k, (mbs, n_tokens, n_seqs) in enumerate(minis):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in mbs:
                measure = moe.Measure(load=True, differ=k == 0, record=cfg.routing_record_dir is not None)
                logprobs, entropy = self._token_stats(self.model, mb, "grad" if cfg.entropy_coef else "detached",
                                                      measure)
                if cfg.routing_record_dir is not None and self.router_stats is not None:
                    used_routing += self._used_routing(mb, shards[k])
                if k == 0:
                    self._set_old_logprobs(mb, logprobs.detach(), totals)
                terms = self.algorithms.loss(logprobs, mb.old_logprobs, mb.advantages, mb.mask, cfg)
                per_token = terms.loss
                weights = self.algorithms.correction_weights(
                    mb.old_logprobs, mb.rollout_logprobs, mb.mask * mb.has_rollout_logprobs.unsqueeze(1).to(mb.mask.dtype))
                if weights is not None:  # trainer.rollout_correction: pi_old / pi_rollout, truncated or masked
                    per_token = per_token * weights
                    totals.add("is_weight", weights, mb.mask)
                loss = losses.aggregate(per_token, mb.mask, cfg.loss_agg, n_tokens, n_seqs)
                if cfg.entropy_coef:
                    loss = loss - cfg.entropy_coef * losses.aggregate(entropy, mb.mask, cfg.loss_agg, n_tokens, n_seqs)
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref_lp = self._token_logprobs(self.ref_model, mb)
                    kl = losses.kl_penalty(logprobs, ref_lp, cfg.kl_estimator)
                    loss = loss + cfg.kl_coef * losses.aggregate(kl, mb.mask, cfg.loss_agg, n_tokens, n_seqs)
                    totals.add("kl", kl, mb.mask)
                loss.backward()
                objective += float(loss.detach()) / n_mini
                totals.tokens += mb.num_tokens
                totals.add("pg_loss", terms.loss, mb.mask)
                totals.add("clipfrac", terms.clipped, mb.mask)
                totals.add("entropy", entropy, mb.mask)
                totals.add("ratio", terms.ratio, mb.mask)
                totals.sums["computed_tokens"] = totals.sums.get("computed_tokens", 0.0) + self._computed_tokens(mb)
                totals.sums["sample_tokens"] = totals.sums.get("sample_tokens", 0.0) + mb.sample_tokens
            self._reduce_grads()
            if self.captured_grads is not None:  # full tensors, before clipping: what equivalence tests compare
                self.captured_grads.append(self._full_state({n: p.grad.detach().clone() if p.grad is not None
                                                             else torch.zeros_like(p)
                                                             for n, p in self.model.named_parameters()}))
            grad_norms.append(self._clip_grads())
            self.optimizer.step()
        if self.dp_size > 1:
            objective = totals.all_reduce(self.dp_group, objective)
        extra = {"ratio_mean": totals.mean("ratio"), "mini_batches": n_mini,
                 # tokens the forward computed / the samples' own tokens: < 1 where a tree shares prefixes
                 "tree_token_ratio": (totals.sums.get("computed_tokens", 0.0)
                                      / max(1.0, totals.sums.get("sample_tokens", 0.0))),
                 "computed_tokens": int(totals.sums.get("computed_tokens", 0.0)), "batch_layout": self.config.batch_layout,
                 **({"rollout_is_weight_mean": totals.mean("is_weight")} if self.algorithms.correction else {})}
        if self.router_stats is not None:
            if self.dp_size > 1:
                self.router_stats.all_reduce(self.dp_group)
            extra.update(self.router_stats.summary())
        self.optimizer.zero_grad(set_to_none=True)
        self.iteration += 1
        if cfg.routing_record_dir is not None and self.router_stats is not None:
            self._write_used_routing(used_routing)
        n_zero = sum(1 for s in seqs if s.advantage == 0.0)
        return TrainMetrics(
            iteration=self.iteration,
            loss=objective,
            pg_loss=totals.mean("pg_loss"),
            pg_clipfrac=totals.mean("clipfrac"),
            kl=totals.mean("kl"),
            entropy=totals.mean("entropy"),
            grad_norm=sum(grad_norms) / len(grad_norms),
            logprob_mismatch_mean=totals.mismatch_mean,
            logprob_mismatch_max=totals.mismatch_max if totals.mismatch_tokens else float("nan"),
            tokens=int(totals.tokens),
            sequences=len(seqs),
            zero_adv_fraction=n_zero / len(seqs),
            time_s=time.perf_counter() - t0,
            extra=extra,
        )

    def _token_logprobs(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        return self._token_stats(model, mb)[0]

    def _used_routing(self, mb: MicroBatch, seqs: list[TrainSequence]) -> list[dict]:
        """After a recorded training forward: per row, the experts the routers used for each token
        whose output the trainer reads (all but the last), beside the rows of the sample's own routing."""
        from seer.trainer.routing import routing_tensor

        used = self.router_stats.used
        if any(u is None for u in used):
            return []
        slots = moe.TokenSlots.of(mb)
        per_token = torch.stack(used, dim=1).sort(-1).values  # [T, layers, top_k]
        out = []
        for row, i in enumerate(mb.indices):
            n = int(slots.read[row].sum())
            s = seqs[i]
            rollout = None if s.routing is None else routing_tensor(s.routing)[:n].sort(-1).values.tolist()
            out.append({"prompt_ids": s.prompt_ids, "response_ids": s.response_ids, "rollout": rollout,
                        "used": per_token[slots.slots[row, :n]].tolist()})
        return out

    def _write_used_routing(self, rows: list[dict]) -> None:
        """trainer.routing_record_dir: this rank's rows of the step just taken, one JSON line each
        (routing_used_<weight version after the step>_<rank>.jsonl)."""
        import json

        out = Path(self.config.routing_record_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / f"routing_used_{self.iteration:04d}_{self.place.rank}.jsonl",
                           "".join(json.dumps({"batch_layout": self.config.batch_layout, **r}) + "\n" for r in rows).encode())

    def _set_old_logprobs(self, mb: MicroBatch, recomputed: torch.Tensor, totals: _Totals) -> None:
        totals.add_mismatch(mb, recomputed)
        mb.old_logprobs = mb.rollout_logprobs if self.config.old_logprobs == "rollout" else recomputed

    # ---- supervised warm start -------------------------------------------------------------

    def sft_step(self, examples: list[SFTExample]) -> TrainMetrics:
        """One optimizer step of token-mean NLL on the responses of ``examples``."""
        t0 = time.perf_counter()
        seqs = [TrainSequence(e.prompt_ids, e.response_ids) for e in examples if e.response_ids]
        n_tokens = float(sum(s.trained_tokens for s in seqs))
        mine = self._shard(seqs)
        mbs = self._micro_batches(mine) if mine or self.ep_size > 1 else []
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in mbs:
            loss = losses.sft_loss(self._token_logprobs(self.model, mb), mb.mask, "token-mean", num_tokens=n_tokens)
            loss.backward()
            total += float(loss.detach())
        self._reduce_grads()
        grad_norm = self._clip_grads()
        self.optimizer.step()
        if self.dp_size > 1:
            summed = torch.tensor([total], dtype=torch.float64)
            dist.all_reduce(summed, group=self.dp_group)
            total = float(summed[0])
        self.optimizer.zero_grad(set_to_none=True)
        self.iteration += 1
        nan = float("nan")
        return TrainMetrics(
            iteration=self.iteration, loss=total, pg_loss=nan, pg_clipfrac=nan, kl=nan, entropy=nan,
            grad_norm=grad_norm, logprob_mismatch_mean=nan, logprob_mismatch_max=nan, tokens=int(n_tokens),
            sequences=len(examples), zero_adv_fraction=nan, time_s=time.perf_counter() - t0,
        )  # fmt: skip

    # ---- weights out -----------------------------------------------------------------------
    # Every rank calls these (tensor-parallel shards are gathered); ranks hold the same result.

    def hf_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Current weights under HF names (fresh CPU tensors: safetensors-ready)."""
        return megatron_weights_as_hf(self.model, self.arch, dtype or self.dtype)

    def export_hf(self, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write a HF checkpoint dir (config, tokenizer files, model.safetensors) of the current weights."""
        dtype = dtype or self.dtype
        return write_hf_checkpoint(self.hf_state_dict(dtype), self.hf_path, out_dir, dtype)

    def export_files(self, dtype: torch.dtype | None = None) -> dict[str, bytes]:
        """The same checkpoint as bytes per file, for instances that share no filesystem with this rank."""
        dtype = dtype or self.dtype
        return checkpoint_files(self.hf_state_dict(dtype), self.hf_path, dtype)

    # ---- resume ----------------------------------------------------------------------------
    # The checkpoint holds full tensors by parameter name (model and Adam moments), so a run saved
    # at one data/tensor-parallel size resumes at any other.

    def state_dict(self) -> dict:
        opt = self.optimizer.state_dict()
        moments: dict[str, dict[str, torch.Tensor]] = {}
        for key in ("exp_avg", "exp_avg_sq"):
            local = {self._param_names[i]: st[key] for i, st in opt["state"].items() if key in st}
            for name, full in self._full_state(local).items():
                moments.setdefault(name, {})[key] = full
        full_names = self._full_names  # under expert parallelism: every rank's experts by global number
        for i, st in opt["state"].items():
            for name in full_names(self._param_names[i]):
                moments.setdefault(name, {})["step"] = st["step"]
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "names": [n for i in g["params"] for n in full_names(self._param_names[i])]}
                  for g in opt["param_groups"]]
        return {
            "format": CHECKPOINT_FORMAT,
            "iteration": self.iteration,
            "model": self._full_state(self._model_state()),
            "optimizer": {"state": moments, "param_groups": groups},
            "config": asdict(self.config),
            "world": {"data_parallel": self.dp_size, "tensor_parallel": self.tp_size, "expert_parallel": self.ep_size},
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != CHECKPOINT_FORMAT:  # a single-process checkpoint of Seer before format 2
            if self.tp_size > 1:
                raise ValueError("this checkpoint predates tensor-parallel resume: resume it at tensor_parallel 1")
            model_state, opt_state = state["model"], state["optimizer"]
        else:
            model_state = self._local_state(state["model"])
            index = {n: i for i, n in enumerate(self._param_names)}
            saved = state["optimizer"]
            if self.ep_size > 1:  # this rank's experts under their local numbers (experts are whole: tp 1)
                ep_rank, experts = parallel_state.get_expert_model_parallel_rank(), self.arch.moe.num_experts
                saved = {"state": moe.ep_local_state(saved["state"], experts, ep_rank, self.ep_size),
                         "param_groups": [{**g, "names": list(moe.ep_local_state(dict.fromkeys(g["names"]), experts,
                                                                                 ep_rank, self.ep_size))}
                                          for g in saved["param_groups"]]}
            local_moments = {}
            for key in ("exp_avg", "exp_avg_sq"):
                full = {n: st[key] for n, st in saved["state"].items() if key in st}
                unknown = sorted(set(full) - set(index))
                if unknown:
                    raise KeyError(f"checkpoint does not match the model: optimizer state for unknown {unknown}")
                for n, t in (full if self.ep_size > 1 else self._local_state(full)).items():
                    local_moments.setdefault(n, {})[key] = t
            # torch pairs saved and current params by position within a group: keep the model's order
            # (a checkpoint saved under expert parallelism lists each local expert's EP copies together)
            opt_state = {
                "state": {index[n]: {"step": saved["state"][n]["step"], **local_moments.get(n, {})}
                          for n in saved["state"]},
                "param_groups": [{**{k: v for k, v in g.items() if k != "names"}, "params": sorted(index[n] for n in g["names"])}
                                 for g in saved["param_groups"]],
            }
        result = self.model.load_state_dict(model_state, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            unexpected = result.unexpected_keys
            raise KeyError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")
        self.optimizer.load_state_dict(opt_state)
        self.iteration = int(state["iteration"])
        torch.set_rng_state(state["torch_rng"])

    def checkpoint_bytes(self) -> bytes | None:
        """The checkpoint serialised (on the writing rank; None on the others: its tensor-parallel
        peers still gather, the other data-parallel replicas skip the work)."""
        if not self.gathers_for_writer:
            return None
        state = self.state_dict()
        if not self.is_writer:
            return None
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def load_checkpoint_bytes(self, data: bytes) -> int:
        self.load_state_dict(torch.load(io.BytesIO(data), map_location="cpu", weights_only=False))
        return self.iteration

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path:
        """Write model, optimizer, iteration and RNG state; the file appears atomically."""
        ckpt_dir = Path(ckpt_dir)
        data = self.checkpoint_bytes()
        if data is not None:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(ckpt_dir / CHECKPOINT_FILE, data, durable=True)
        return ckpt_dir / CHECKPOINT_FILE

    def load_checkpoint(self, ckpt_dir: str | Path) -> int:
        """Restore a ``save_checkpoint`` directory; returns the iteration to continue from."""
        return self.load_checkpoint_bytes((Path(ckpt_dir) / CHECKPOINT_FILE).read_bytes())
