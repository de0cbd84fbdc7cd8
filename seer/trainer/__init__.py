"""Megatron-core GRPO trainer: HF checkpoint in, GRPO/SFT updates, exact HF checkpoint out.

``Trainer``, ``TrainerConfig``, ``TrainMetrics`` and ``SFTExample`` are imported lazily, so that
``seer.trainer.losses`` stays usable without paying for the Megatron import.
"""

from __future__ import annotations

import warnings

# Megatron-core announces at import that the optional GPU kernels (Transformer Engine, Apex) are
# absent and falls back to torch; on CPU that is expected, and 7 warnings per run bury the
# progress output. Only these notices are silenced.
for _notice in (r"Transformer Engine and Apex are not installed", r"Apex is not installed",
                r"full scope is deprecated"):
    warnings.filterwarnings("ignore", message=_notice, category=UserWarning)

__all__ = ["SFTExample", "TrainMetrics", "Trainer", "TrainerConfig"]


def __getattr__(name: str):
    if name == "TrainerConfig":
        from seer.trainer.config import TrainerConfig

        return TrainerConfig
    if name in __all__:
        from seer.trainer import trainer

        return getattr(trainer, name)
    raise AttributeError(name)
