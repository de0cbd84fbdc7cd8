"""What one training step reports: a plain record, importable without torch (the driver reads it
from the trainer's ranks)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
                "logprob_mismatch_mean": self.logprob_mismatch_mean, "logprob_mismatch_max": self.logprob_mismatch_max,
                # tokens computed / the samples' tokens (docs/trainer.md): < 1 where a prefix tree shares
                "tree_token_ratio": self.extra.get("tree_token_ratio", float("nan")),
                **{k: self.extra[k] for k in ("rollout_is_weight_mean",) if k in self.extra},  # rollout_correction on
                # MoE models: expert load and router entropy (seer.trainer.moe.RouterStats)
                **{k: v for k, v in self.extra.items() if k.startswith("moe_")}}
