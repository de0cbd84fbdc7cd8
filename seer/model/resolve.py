"""Turns the config's `model` setting into a checkpoint directory."""

from __future__ import annotations

import os
from pathlib import Path

from seer.model.build import ensure_model
from seer.model.checkpoint import check_hf_checkpoint
from seer.model.presets import PRESETS


def resolve_model(spec: str | os.PathLike | None = None, *, progress: bool = True) -> Path:
    """A preset name ("default", "tiny"; None means "default") is built or reused; anything else
    must be a local HF checkpoint directory (write "./tiny" for a directory named like a preset)."""
    if spec is None or (isinstance(spec, str) and spec in PRESETS):
        return ensure_model(spec or "default", progress=progress)
    return check_hf_checkpoint(Path(spec).expanduser())
