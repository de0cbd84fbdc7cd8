"""Megatron-core GRPO trainer: HF checkpoint in, GRPO/SFT updates, exact HF checkpoint out.

``Trainer``, ``TrainerConfig``, ``TrainMetrics`` and ``SFTExample`` are imported lazily, so that
``seer.trainer.losses`` stays usable without paying for the Megatron import.
"""

from __future__ import annotations

__all__ = ["SFTExample", "TrainMetrics", "Trainer", "TrainerConfig"]


def __getattr__(name: str):
    if name == "TrainerConfig":
        from seer.trainer.config import TrainerConfig

        return TrainerConfig
    if name in __all__:
        from seer.trainer import trainer

        return getattr(trainer, name)
    raise AttributeError(name)
