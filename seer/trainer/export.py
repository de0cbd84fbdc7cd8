"""Write the trainer's weights as a HF checkpoint directory that vLLM and transformers load.

The directory is the source checkpoint's with new weights: config.json (dtype updated), tokenizer
and generation files copied over, and one ``model.safetensors``. Files are written under temporary
names and renamed into place, so a reader never sees a half-written weight file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def atomic_write_bytes(path: Path, data: bytes, durable: bool = False) -> Path:
    """`data` at `path` under a temporary name renamed into place, so a reader never sees half a
    file; `durable` fsyncs it first (checkpoints: a crash right after must leave the new file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def checkpoint_files(hf_state: dict[str, torch.Tensor], src_dir: str | Path, dtype: torch.dtype) -> dict[str, bytes]:
    """The files of a HF checkpoint of ``hf_state`` as bytes: src_dir's tokenizer and generation
    files, its config.json with the dtype updated, and one ``model.safetensors``. What an export
    writes, and what travels to instances that do not share a filesystem with the trainer."""
    src_dir = Path(src_dir)
    files = {f.name: f.read_bytes() for f in sorted(src_dir.iterdir())
             if f.is_file() and f.name not in _WEIGHT_FILES and f.name != "config.json"
             and not f.name.endswith((".safetensors", ".bin", ".pt")) and not f.name.startswith(".")}
    config = json.loads((src_dir / "config.json").read_text())
    config["dtype"] = _DTYPE_NAMES[dtype]
    if "torch_dtype" in config:
        config["torch_dtype"] = _DTYPE_NAMES[dtype]
    files["config.json"] = (json.dumps(config, indent=2) + "\n").encode()
    files["model.safetensors"] = save(hf_state, metadata={"format": "pt"})
    return files


def write_hf_checkpoint(
    hf_state: dict[str, torch.Tensor],
    src_dir: str | Path,
    out_dir: str | Path,
    dtype: torch.dtype,
) -> Path:
    """Write ``hf_state`` (HF names, CPU tensors of ``dtype``) plus src_dir's non-weight files."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if out_dir.exists() and out_dir.resolve() == src_dir.resolve():
        raise ValueError(f"refusing to export over the source checkpoint {src_dir}")
    return write_checkpoint_files(checkpoint_files(hf_state, src_dir, dtype), out_dir)


def write_checkpoint_files(files: dict[str, bytes], out_dir: str | Path) -> Path:
    """Write a checkpoint's files into out_dir, the weights before config.json (a reader that sees
    the new config sees the new weights); an older sharded export never shadows the new file."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in _WEIGHT_FILES[1:]:
        (out_dir / stale).unlink(missing_ok=True)
    for name in sorted(files, key=lambda n: n == "config.json"):
        atomic_write_bytes(out_dir / name, files[name])
    return out_dir
