"""Validation of user-supplied Hugging Face checkpoint directories.

Why a check of our own: vLLM and transformers fail late and cryptically on a half-copied
checkpoint (often after minutes of start-up); this names the missing piece up front.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class CheckpointError(ValueError):
    """A model directory that cannot serve as a Hugging Face causal LM checkpoint."""


def checkpoint_problems(path: str | os.PathLike) -> list[str]:
    """Everything missing or broken in `path`, as human-readable lines (empty when usable)."""
    p = Path(path)
    if not p.is_dir():
        return [f"{p} is not a directory"]
    problems = []
    config = p / "config.json"
    if not config.is_file():
        problems.append("config.json is missing")
    else:
        try:
            data = json.loads(config.read_text())
            if not isinstance(data, dict) or "model_type" not in data:
                problems.append("config.json has no 'model_type'")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            problems.append(f"config.json is not valid JSON ({e})")
    if not any((p / f).is_file() for f in WEIGHT_FILES) and not any(p.glob("*.safetensors")):
        problems.append(f"no weights (expected one of {', '.join(WEIGHT_FILES)})")
    if not (p / "tokenizer_config.json").is_file():
        problems.append("tokenizer_config.json is missing")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        problems.append(f"no tokenizer model (expected one of {', '.join(TOKENIZER_FILES)})")
    return problems


def is_local_hf_checkpoint(path: str | os.PathLike) -> bool:
    return not checkpoint_problems(path)


def check_hf_checkpoint(path: str | os.PathLike) -> Path:
    """Return `path` resolved, or raise CheckpointError listing every problem."""
    problems = checkpoint_problems(path)
    if problems:
        raise CheckpointError(f"{path} is not a usable Hugging Face checkpoint: " + "; ".join(problems))
    return Path(path).resolve()
