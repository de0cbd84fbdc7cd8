"""The `trainer:` section of a run config: a plain dataclass, importable without torch or Megatron."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

AggMode = Literal["token-mean", "seq-mean-token-mean"]
KLEstimator = Literal["k1", "k3"]
BatchLayout = Literal["tree", "packed", "padded"]
MiniBatchSplit = Literal["groups", "strided"]


@dataclass
class TrainerConfig:
    lr: float = 1e-6  # Adam learning rate
    betas: tuple[float, float] = (0.9, 0.999)  # Adam betas
    adam_eps: float = 1e-8  # Adam epsilon
    weight_decay: float = 0.0  # applied to matrices only, never to norms or biases
    max_grad_norm: float = 1.0  # gradient clipping by global norm
    clip_eps_low: float = 0.2  # PPO/GRPO ratio clip below 1 (and above, unless clip_eps_high)
    clip_eps_high: float | None = None  # None: symmetric clipping (a larger one is DAPO's clip-higher)
    loss_agg: AggMode = "token-mean"  # average the loss over all tokens, or per sequence then over sequences
    old_logprobs: Literal["recomputed", "rollout"] = "recomputed"  # the ratio's old log-probs: the trainer's own or vLLM's
    normalize_adv_std: bool = True  # old key: false is advantage_estimator dr_grpo (no division by the group's std)
    # The algorithm registry (seer.trainer.algorithms; docs/trainer.md "Algorithms"): each key takes a
    # name or a `package.module:function` path, and its *_args key the function's own keyword arguments.

    # grpo | dr_grpo | rloo | reinforce_pp_baseline (or a path): group rewards -> one advantage per sample
    advantage_estimator: str = "grpo"
    advantage_args: dict[str, Any] = field(default_factory=dict)  # the estimator's keyword arguments (eps, ...)
    # ppo_clip | clip_higher | dual_clip | gspo | cispo (or a path): the per-token surrogate; clip_eps_low/high apply
    policy_loss: str = "ppo_clip"
    policy_loss_args: dict[str, Any] = field(default_factory=dict)  # the loss's keyword arguments (dual_clip: clip_c)
    # none | token_tis | seq_tis | token_mask | seq_mask: weight the loss by pi_old / pi_rollout, truncated or masked.
    # Truncated IS weights (tis) or rejection outside a band (mask), per token or per sequence; needs
    # old_logprobs: recomputed (with old_logprobs: rollout the PPO ratio is pi / pi_rollout already).
    rollout_correction: str = "none"
    rollout_correction_args: dict[str, Any] = field(default_factory=dict)  # cap (tis), low / high (mask)
    reward_shaping: str = "none"  # none | overlong (DAPO's soft penalty for responses near rollout.max_tokens)
    reward_shaping_args: dict[str, Any] = field(default_factory=dict)  # overlong: buffer_tokens, penalty
    max_response_tokens: int | None = None  # set from rollout.max_tokens by seer-run (overlong shaping's limit)
    kl_coef: float = 0.0  # > 0 keeps a frozen copy of the initial weights as the reference
    kl_estimator: KLEstimator = "k3"  # KL penalty estimator (with kl_coef > 0)
    entropy_coef: float = 0.0  # entropy is always logged; this only adds a bonus
    mini_batches: int = 1  # optimizer steps per train_step
    # How a batch is cut into mini_batches (docs/trainer.md "Mini-batches"): groups keeps the samples
    # that share a prefix (a group's G samples) in one mini-batch, mini-batches balanced by tokens, as
    # verl does without shuffling, so a tree computes each prompt once per step; strided takes every
    # m-th sample (Seer before, each group spread over all m mini-batches).
    mini_batch_split: MiniBatchSplit = "groups"
    # How a micro-batch is computed (docs/trainer.md "Packed and tree batches"): tree merges shared
    # prefixes (a group's prompt, earlier turns) so each is computed once; packed lays sequences end
    # to end without padding; padded is the old right-padded layout. All three give the same gradients.
    batch_layout: BatchLayout = "tree"
    max_tokens_per_micro_batch: int = 8192  # tokens computed per forward/backward: real (tree/packed) or rows x longest (padded)
    temperature: float = 1.0  # must match how the rollout's logprobs were computed
    params_dtype: str = "float32"  # the trainer's parameter dtype
    pad_token_id: int = 0  # set from the tokenizer by seer-run
    seed: int = 0  # the trainer's random seed
    # The trainer's world: data_parallel x tensor_parallel ranks, each a Ray actor in its own bundle.
    data_parallel: int = 1  # replicas that split each batch (balanced by tokens) and all-reduce gradients
    tensor_parallel: int = 1  # ranks that split every layer (Megatron's column/row-parallel linears)
    pipeline_parallel: int = 1  # only 1: see docs/trainer.md
    # MoE models (docs/models.md): experts split over expert_parallel ranks of the same world (as in
    # Megatron, the expert-parallel ranks are data-parallel ranks of the dense layers).
    expert_parallel: int = 1  # ranks that split each MoE layer's experts (divides the world size)
    # MoE routing replay (R3): the instances record each token's experts and the trainer's routers
    # replay them (docs/models.md); refused for a dense model
    routing_replay: bool = False
    # MoE: capture the rollout's routing without replaying it, for the moe_routing_differ_* metrics
    # (how far the trainer's router is from the engine's); routing_replay captures it anyway
    routing_capture: bool = False
    # A folder (tests, debugging R3): each rank writes per step the experts its routers used for every
    # trained token beside the sample's routing (routing_used_<version>_<rank>.jsonl); None: nothing
    routing_record_dir: str | None = None
    moe_aux_loss_coef: float = 0.0  # MoE load-balancing loss weight; 0 in RL, as verl and slime default
    cpus_per_rank: float = 0.1  # Ray CPUs a rank's bundle reserves: small, as ranks run while instances idle
    gpus_per_rank: float = 0.0  # Ray GPUs a rank's bundle reserves (1 on a GPU cluster)
    placement_strategy: str = "PACK"  # the ranks' placement group: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD
    threads_per_rank: int | None = None  # torch threads; None: the rank's node cores / ranks on that node

    def __post_init__(self) -> None:
        if self.batch_layout not in ("tree", "packed", "padded"):
            raise ValueError(f"trainer.batch_layout must be tree, packed or padded, got {self.batch_layout!r}")
        if self.mini_batch_split not in ("groups", "strided"):
            raise ValueError(f"trainer.mini_batch_split must be groups or strided, got {self.mini_batch_split!r}")
        for name in ("data_parallel", "tensor_parallel", "pipeline_parallel", "expert_parallel"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.pipeline_parallel != 1:
            raise ValueError("trainer.pipeline_parallel > 1 is not supported: Seer's GRPO step runs the whole "
                             "model per rank (use tensor_parallel and data_parallel)")
        if self.world_size % self.expert_parallel:
            raise ValueError(f"trainer.expert_parallel {self.expert_parallel} must divide the trainer's world size "
                             f"{self.world_size} (data_parallel x tensor_parallel): expert-parallel ranks are "
                             "data-parallel ranks of the dense layers")
        if self.moe_aux_loss_coef < 0:
            raise ValueError(f"trainer.moe_aux_loss_coef must be >= 0, got {self.moe_aux_loss_coef}")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"trainer.placement_strategy must be PACK, SPREAD, STRICT_PACK or STRICT_SPREAD, "
                             f"got {self.placement_strategy!r}")
        if self.cpus_per_rank < 0 or self.gpus_per_rank < 0 or self.cpus_per_rank + self.gpus_per_rank == 0:
            raise ValueError("trainer.cpus_per_rank and gpus_per_rank must be >= 0, not both 0")

    @property
    def captures_routing(self) -> bool:
        """Whether the instances record each token's experts (replayed, or only measured)."""
        return self.routing_replay or self.routing_capture

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True)
class RankPlace:
    """Where one rank sits in the trainer's world."""

    rank: int = 0
    world_size: int = 1
    init_method: str | None = None  # tcp://host:port of rank 0's store; None: a private file store
    tensor_parallel: int = TrainerConfig.tensor_parallel
    pipeline_parallel: int = TrainerConfig.pipeline_parallel
    expert_parallel: int = TrainerConfig.expert_parallel
    timeout_s: float = 600.0  # a collective that waits longer fails (a lost rank), it never hangs

    @property
    def data_parallel(self) -> int:
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel)
