"""The GRPO trainer: one ``train_step`` per rollout iteration on a Megatron-core GPTModel.

Seer is strictly synchronous: the batch handed to ``train_step`` was sampled by exactly the weights
the trainer holds now. The step therefore measures the train-inference log-prob mismatch on those
(pre-update) weights, then updates. With one mini-batch and recomputed old log-probs, the old
log-probs are the detached log-probs of the training forward itself (same weights, same tokens),
so no extra forward pass is spent on them.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from seer.types import RolloutBatch
from seer.trainer import losses
from seer.trainer.config import TrainerConfig
from seer.trainer.batching import MicroBatch, TrainSequence, make_micro_batches
from seer.trainer.distributed import device as default_device
from seer.trainer.distributed import RankPlace, init_megatron
from seer.trainer.export import write_hf_checkpoint
from seer.trainer.hf_mapping import HFArch
from seer.trainer.model import (
    build_gpt_model,
    forward_logits,
    load_hf_weights,
    megatron_weights_as_hf,
    read_hf_state_dict,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECKPOINT_FILE = "trainer_state.pt"


@dataclass
class TrainMetrics:
    iteration: int  # weight version after this step
    loss: float
    pg_loss: float
    pg_clipfrac: float
    kl: float
    entropy: float
    grad_norm: float
    logprob_mismatch_mean: float  # mean |recomputed - rollout| over response tokens, pre-update
    logprob_mismatch_max: float
    tokens: int  # response tokens trained on
    sequences: int
    zero_adv_fraction: float  # share of sequences whose group had no reward spread
    time_s: float
    extra: dict = field(default_factory=dict)

    def record(self) -> dict:
        """The fields an iteration's metrics record carries (seer.metrics_log)."""
        return {"train_s": self.time_s, "loss": self.loss, "pg_clipfrac": self.pg_clipfrac, "kl": self.kl,
                "entropy": self.entropy, "grad_norm": self.grad_norm, "zero_adv_fraction": self.zero_adv_fraction,
                "logprob_mismatch_mean": self.logprob_mismatch_mean, "logprob_mismatch_max": self.logprob_mismatch_max}


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

    def add_mismatch(self, mb: MicroBatch, recomputed: torch.Tensor) -> None:
        m = mb.mask * mb.has_rollout_logprobs.unsqueeze(1).to(mb.mask.dtype)
        if m.sum() == 0:
            return
        diff = (recomputed.detach() - mb.rollout_logprobs).abs() * m
        self.mismatch_sum += float(diff.sum())
        self.mismatch_tokens += float(m.sum())
        self.mismatch_max = max(self.mismatch_max, float(diff.max()))


class Trainer:
    """Megatron-core policy + AdamW, loaded from and exported to HF checkpoints.

    ``iteration`` counts completed updates (``train_step`` / ``sft_step`` calls): it is the weight
    version of the weights held now, and what ``load_checkpoint`` returns for --resume.
    """

    def __init__(self, hf_path: str | Path, config: TrainerConfig | None = None, place: RankPlace | None = None) -> None:
        self.config = config or TrainerConfig()
        self.place = place or RankPlace()
        self.hf_path = Path(hf_path)
        init_megatron(self.config.seed, place)
        self.device = default_device()
        self.dtype = _DTYPES[self.config.params_dtype]
        self.arch = HFArch.from_dir(self.hf_path)
        hf_state = read_hf_state_dict(self.hf_path)
        self.model = self._build(hf_state)
        self.ref_model = None  # the initial weights, frozen (also after a resume)
        if self.config.kl_coef > 0:
            self.ref_model = self._build(hf_state).eval().requires_grad_(False)
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
        )
        self.iteration = 0

    def _build(self, hf_state: dict[str, torch.Tensor]) -> torch.nn.Module:
        model = build_gpt_model(self.arch, self.dtype)
        load_hf_weights(model, hf_state, self.arch)
        return model.to(self.device)

    # ---- forward helpers -------------------------------------------------------------------

    def _logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        return forward_logits(model, mb.input_ids)[:, :-1]

    def _micro_batches(self, seqs: list[TrainSequence]) -> list[MicroBatch]:
        return [
            mb.to(self.device)
            for mb in make_micro_batches(seqs, self.config.max_tokens_per_micro_batch, self.config.pad_token_id)
        ]

    @torch.no_grad()
    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """Log-probs of each response token under the current weights (no update)."""
        seqs = [TrainSequence(p, r) for p, r in zip(prompts, responses, strict=True)]
        out: list[list[float]] = [[] for _ in seqs]
        self.model.eval()
        for mb in self._micro_batches(seqs):
            lp = losses.token_logprobs(self._logits(self.model, mb), mb.targets, self.config.temperature)
            for row, i in enumerate(mb.indices):
                out[i] = lp[row][mb.mask[row].bool()].tolist()
        return out

    # ---- GRPO ------------------------------------------------------------------------------

    def sequences_from_batch(self, batch: RolloutBatch) -> list[TrainSequence]:
        """Samples -> TrainSequences with GRPO advantages (missing rewards count as 0)."""
        samples = [s for group in batch.groups().values() for s in group]
        rewards = torch.tensor([0.0 if s.reward is None else float(s.reward) for s in samples])
        group_ids = torch.tensor([s.group_id for s in samples])
        adv = losses.grpo_advantages(rewards, group_ids, normalize_std=self.config.normalize_adv_std)
        return [
            TrainSequence(
                prompt_ids=list(s.prompt.prompt_ids),
                response_ids=list(s.response_ids),
                advantage=float(a),
                rollout_logprobs=list(s.logprobs) if s.logprobs else None,
                loss_mask=list(s.loss_mask) if s.loss_mask is not None else None,
            )
            for s, a in zip(samples, adv.tolist(), strict=True)
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
        minis = [self._micro_batches(seqs[k::n_mini]) for k in range(n_mini)]
        totals = _Totals()

        # Old log-probs and the mismatch check for later mini-batches must see pre-update weights.
        self.model.eval()
        with torch.no_grad():
            for mbs in minis[1:]:
                for mb in mbs:
                    self._set_old_logprobs(mb, self._token_logprobs(self.model, mb), totals)

        self.model.train()
        grad_norms, objective = [], 0.0
        for k, mbs in enumerate(minis):
            n_tokens = float(sum(mb.num_tokens for mb in mbs))
            n_seqs = float(sum(int((mb.mask.sum(-1) > 0).sum()) for mb in mbs))
            self.optimizer.zero_grad(set_to_none=True)
            for mb in mbs:
                logits = self._logits(self.model, mb)
                logprobs = losses.token_logprobs(logits, mb.targets, cfg.temperature)
                if k == 0:
                    self._set_old_logprobs(mb, logprobs.detach(), totals)
                terms = losses.ppo_clip_terms(
                    logprobs, mb.old_logprobs, mb.advantages, cfg.clip_eps_low, cfg.clip_eps_high
                )
                loss = losses.aggregate(terms.loss, mb.mask, cfg.loss_agg, n_tokens, n_seqs)
                entropy = losses.entropy_from_logits(logits if cfg.entropy_coef else logits.detach(), cfg.temperature)
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
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iteration += 1
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
            extra={"ratio_mean": totals.mean("ratio"), "mini_batches": n_mini},
        )

    def _token_logprobs(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        return losses.token_logprobs(self._logits(model, mb), mb.targets, self.config.temperature)

    def _set_old_logprobs(self, mb: MicroBatch, recomputed: torch.Tensor, totals: _Totals) -> None:
        totals.add_mismatch(mb, recomputed)
        mb.old_logprobs = mb.rollout_logprobs if self.config.old_logprobs == "rollout" else recomputed

    # ---- supervised warm start -------------------------------------------------------------

    def sft_step(self, examples: list[SFTExample]) -> TrainMetrics:
        """One optimizer step of token-mean NLL on the responses of ``examples``."""
        t0 = time.perf_counter()
        mbs = self._micro_batches([TrainSequence(e.prompt_ids, e.response_ids) for e in examples if e.response_ids])
        n_tokens = float(sum(mb.num_tokens for mb in mbs))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in mbs:
            loss = losses.sft_loss(self._token_logprobs(self.model, mb), mb.mask, "token-mean", num_tokens=n_tokens)
            loss.backward()
            total += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iteration += 1
        nan = float("nan")
        return TrainMetrics(
            iteration=self.iteration, loss=total, pg_loss=nan, pg_clipfrac=nan, kl=nan, entropy=nan,
            grad_norm=grad_norm, logprob_mismatch_mean=nan, logprob_mismatch_max=nan, tokens=int(n_tokens),
            sequences=len(examples), zero_adv_fraction=nan, time_s=time.perf_counter() - t0,
        )  # fmt: skip

    # ---- weights out -----------------------------------------------------------------------

    def hf_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Current weights under HF names (CPU tensors), e.g. for an in-memory weight update."""
        return megatron_weights_as_hf(self.model, self.arch, dtype or self.dtype)

    def export_hf(self, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write a HF checkpoint dir (config, tokenizer files, model.safetensors) of the current weights."""
        dtype = dtype or self.dtype
        return write_hf_checkpoint(self.hf_state_dict(dtype), self.hf_path, out_dir, dtype)

    # ---- resume ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        model_state = {k: v for k, v in self.model.state_dict().items() if not k.endswith("_extra_state")}
        return {
            "iteration": self.iteration,
            "model": model_state,
            "optimizer": self.optimizer.state_dict(),
            "config": asdict(self.config),
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        result = self.model.load_state_dict(state["model"], strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            unexpected = result.unexpected_keys
            raise KeyError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
        torch.set_rng_state(state["torch_rng"])

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path:
        """Write model, optimizer, iteration and RNG state; the file appears atomically."""
        ckpt_dir = Path(ckpt_dir)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        tmp = ckpt_dir / f".{CHECKPOINT_FILE}.tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, ckpt_dir / CHECKPOINT_FILE)
        return ckpt_dir / CHECKPOINT_FILE

    def load_checkpoint(self, ckpt_dir: str | Path) -> int:
        """Restore a ``save_checkpoint`` directory; returns the iteration to continue from."""
        state = torch.load(Path(ckpt_dir) / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
        self.load_state_dict(state)
        return self.iteration
