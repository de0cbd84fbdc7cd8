"""The embedded default model (a small Qwen2 built and warm-started locally) and checkpoint checks."""

from seer.model.build import cache_root, ensure_model, model_dir, recipe_hash
from seer.model.checkpoint import CheckpointError, check_hf_checkpoint, checkpoint_problems, is_local_hf_checkpoint
from seer.model.presets import PRESETS, get_preset
from seer.model.resolve import resolve_model

__all__ = [
    "PRESETS",
    "CheckpointError",
    "cache_root",
    "check_hf_checkpoint",
    "checkpoint_problems",
    "ensure_model",
    "get_preset",
    "is_local_hf_checkpoint",
    "model_dir",
    "recipe_hash",
    "resolve_model",
]
