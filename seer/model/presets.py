"""Build recipes of the embedded models: architecture plus supervised warm start.

A preset is the whole recipe: its hash names the cache directory, so changing any field here
builds a new model instead of silently reusing a stale one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from seer.tasks.calculator import CalcTaskConfig
from seer.tasks.running_sum import RunningSumConfig

# Characters per trace line of the default task ("-8=0365\n"): what the offset heads look back.
LINE = RunningSumConfig().width + 4


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3.1's RoPE scaling (config rope_type "llama3"), at a tiny model's scale."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 512


@dataclass(frozen=True)
class MoESpec:
    """Routed experts of a Qwen3-MoE preset (every layer sparse; filled in by the MoE work)."""

    num_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 64
    norm_topk_prob: bool = True  # the top-k weights renormalised to sum 1, as the released Qwen3-MoE models


# model families a preset can be built as (seer/model/build.py: HF config per family)
FAMILIES = ("qwen2", "qwen3", "llama3", "qwen3_moe")


@dataclass(frozen=True)
class ArchSpec:
    """Sizes and family. head_dim (hidden / heads unless set) must be a size vLLM's CPU attention
    supports (>= 32)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # < num_heads: grouped-query attention
    intermediate_size: int
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    vocab_size: int = 320  # the byte vocabulary (4 special + 256) padded
    # Fields below were added after the first presets were built: recipe_hash leaves them out
    # while they hold these defaults, so the caches of the presets above stay valid.
    family: str = "qwen2"
    head_dim: int | None = None  # None: hidden / heads (Qwen3 decouples them)
    llama3_rope: Llama3Rope | None = None  # family "llama3" only
    moe: MoESpec | None = None  # family "qwen3_moe" only

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; known: {', '.join(FAMILIES)}")


@dataclass(frozen=True)
class WarmStartSpec:
    """Supervised training on reference traces of the default task (a disjoint seed)."""

    steps: int  # optimizer steps; the budget that sets build time
    train_prompts: int  # generated traces; must fill `steps` batches
    tokens_per_batch: int  # padded tokens per optimizer step (small: many updates learn fastest here)
    lr: float
    warmup_fraction: float = 0.05
    min_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 1234
    threads: int = 2  # fixed: float reduction order, hence the weights, depends on it
    # The demonstrations' task: the running sum (single-turn traces), or the calculator task
    # (multi-turn trajectories: the loss covers the model's turns, not the calculator's answers).
    task: RunningSumConfig | CalcTaskConfig = field(default_factory=lambda: RunningSumConfig(seed=1_000_003))
    # layer-0 heads that start looking this many tokens back (see seer/model/offset_heads.py)
    offset_heads: tuple[int, ...] = ()
    # Share of demonstrations that restate the prompt's start line before the first step: noisy
    # demonstrations, as real SFT data has. The reward counts a response that is not steps only
    # as a slip at step 0 (reward 0), so this is a habit RL must unlearn, one decision per
    # response; it is what makes learning visible within a few GRPO iterations on two cores.
    restate_fraction: float = 0.0


@dataclass(frozen=True)
class ModelPreset:
    name: str
    arch: ArchSpec
    warm_start: WarmStartSpec | None
    init_seed: int = 0


PRESETS: dict[str, ModelPreset] = {
    # ~3M parameters: decoding cost is visible on a CPU, yet it trains in minutes.
    "default": ModelPreset(
        name="default",
        arch=ArchSpec(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=768),
        warm_start=WarmStartSpec(
            steps=1000,
            train_prompts=4000,
            tokens_per_batch=1024,
            lr=3e-3,
            offset_heads=(LINE, LINE, LINE - 1, LINE + 1, 1, 2, 3, 4),
            restate_fraction=0.5,
        ),
    ),
    # For tests: builds in seconds, still emits task-shaped traces that end with EOS.
    "tiny": ModelPreset(
        name="tiny",
        arch=ArchSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=192),
        warm_start=WarmStartSpec(
            steps=500, train_prompts=2000, tokens_per_batch=1024, lr=1e-2, offset_heads=(LINE, 2)
        ),
    ),
    # The calculator task's own model (task.name=calculator), so the default model stays as it is:
    # the call in one turn starts 11 tokens after the answer's first digit ("=0015\n<calc>0015").
    "calc": ModelPreset(
        name="calc",
        arch=ArchSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=1, intermediate_size=384),
        warm_start=WarmStartSpec(
            steps=500, train_prompts=3000, tokens_per_batch=1024, lr=5e-3,
            task=CalcTaskConfig(seed=1_000_003), offset_heads=(11, 11, 1, 2), restate_fraction=0.5,
        ),
    ),
}

# The default's task, on the other families: the same sizes (head_dim 32 as vLLM's CPU attention
# needs) and warm start; Qwen3 without the offset-head prior (its QK-norm learns the look-back:
# at the tiny sizes its warm start ended lower without it, bench/results/models/warm_start/).
_SMALL = dict(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=768)
_NO_PRIOR = dataclasses.replace(PRESETS["default"].warm_start, offset_heads=())
_TINY = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=192)
PRESETS.update({
    "qwen3": ModelPreset(name="qwen3", arch=ArchSpec(**_SMALL, family="qwen3"), warm_start=_NO_PRIOR),
    # Llama 3's RoPE scaling stays on (its path is what the preset exercises), but at theta 10000:
    # with Llama 3.1's 500000 only 4 of 16 frequency pairs turn within 128 tokens, too few to find
    # "one line back" here, and neither warm start taught it (reward 0 in both arms,
    # bench/results/models/families/ at 1980b67); with the offset-head prior it does.
    "llama3": ModelPreset(name="llama3", arch=ArchSpec(**_SMALL, family="llama3", rope_theta=10000.0,
                                                       llama3_rope=Llama3Rope()), warm_start=PRESETS["default"].warm_start),
    # Untrained, built in seconds: for tests that need the family's architecture, not its skill.
    "tiny-qwen3": ModelPreset(name="tiny-qwen3", arch=ArchSpec(**_TINY, family="qwen3"), warm_start=None),
    "tiny-llama3": ModelPreset(name="tiny-llama3", arch=ArchSpec(**_TINY, family="llama3", rope_theta=500000.0,
                                                                 llama3_rope=Llama3Rope()), warm_start=None),
    # Qwen3-MoE at the default's sizes, every layer sparse (8 experts of 192, top 2: active MLP
    # width 384, half the dense one's) with the default's warm start: offset heads included, since
    # a 2-layer MoE trial ended at loss 0.83 without them and 0.33 with them.
    "qwen3-moe": ModelPreset(name="qwen3-moe", arch=ArchSpec(**_SMALL, family="qwen3_moe",
                                                             moe=MoESpec(moe_intermediate_size=192)),
                             warm_start=PRESETS["default"].warm_start),
    "tiny-qwen3-moe": ModelPreset(name="tiny-qwen3-moe", arch=ArchSpec(**_TINY, family="qwen3_moe", moe=MoESpec()),
                                  warm_start=None),
})


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}") from None


# sha256 of model.safetensors as build_pinned writes it (seer/model/build.py: AVX2 kernels on any
# x86-64 CPU with AVX2), torch 2.13.0+cpu: the presets the suite builds. A recipe change records
# the new value here; any other difference is a build that depends on the machine.
WEIGHTS_TORCH = "2.13.0+cpu"
WEIGHTS_SHA256 = {
    "default": "1ff7d4669d9e2401b5fc9513328d63f18f5107973145c5ba48c91e184c4d38c8",
    "tiny": "4e8b628df595c300b4fa6ab63acd999de6e540355d2def9d86d36a648406b22a",
    "tiny-qwen3": "cf1e34fac5b785259bbad63189f9df15894aab81b5520fdbd1db2284876e9195",
    "tiny-llama3": "c510b1b9b3af83afed52d2d9b934298c9df8107cb4f1346b603e3de2e85f29cb",
    "tiny-qwen3-moe": "c533f621e88ee4ddceb54e6b350e89f82425d2ab99f4043cd407257be2ea58e8",
}
