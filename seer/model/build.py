"""Builds the embedded default model into a cache directory, once.

Nothing can be downloaded, so Seer makes its own small Qwen2 model and tokenizer on first use.
The directory name carries a hash of the whole build recipe; building happens in a temporary
directory renamed into place, under a file lock, so concurrent first uses (tests, several
processes) build once and never see a half-written model.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from seer.model.checkpoint import check_hf_checkpoint
from seer.model.presets import ArchSpec, ModelPreset, get_preset
from seer.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB
from seer.tasks import running_sum

RECIPE_VERSION = 1  # bump when build code changes what it produces
BUILD_INFO = "seer_build.json"


def cache_root() -> Path:
    """`$SEER_CACHE_DIR` if set, else ~/.cache/seer."""
    env = os.environ.get("SEER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "seer"


def _recipe(preset: ModelPreset) -> dict:
    """The preset as hashed: ArchSpec's later fields only where they differ from their defaults
    (presets.py), so adding a field never renames the caches of the presets that leave it unset."""
    recipe = dataclasses.asdict(preset)
    for f in dataclasses.fields(ArchSpec):
        if f.name in _ARCH_FIELDS_ADDED_LATER and recipe["arch"][f.name] == f.default:
            del recipe["arch"][f.name]
    return recipe


_ARCH_FIELDS_ADDED_LATER = ("family", "head_dim", "llama3_rope", "moe")


def recipe_hash(preset: ModelPreset) -> str:
    recipe = {
        "version": RECIPE_VERSION,
        "preset": _recipe(preset),
        "vocab": VOCAB,
        "task": {"prompt": running_sum.PROMPT_TEMPLATE, "format": running_sum.TRACE_FORMAT_VERSION},
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def model_dir(preset: str | ModelPreset, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `preset` lives (built or not)."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / "models" / f"{p.name}-{recipe_hash(p)}"


def ensure_model(
    preset: str | ModelPreset, *, cache_dir: str | os.PathLike | None = None, progress: bool = True
) -> Path:
    """Path of the built preset, building it first if the cache lacks it."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    final = model_dir(p, cache_dir)
    if (final / BUILD_INFO).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder finishes first; we then reuse it
        if (final / BUILD_INFO).is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        try:
            build_model(p, tmp, progress=progress)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is for everyone who can read it
            if final.exists():  # a leftover without BUILD_INFO: incomplete, replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def hf_config(a: ArchSpec):
    """The transformers config of an ArchSpec, by family (the classes ship with transformers:
    nothing is downloaded)."""
    import transformers

    rope = {"rope_type": "default", "rope_theta": a.rope_theta}
    if a.family == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": a.rope_theta, **dataclasses.asdict(a.llama3_rope)}
    common = dict(
        vocab_size=a.vocab_size,
        hidden_size=a.hidden_size,
        intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_layers,
        num_attention_heads=a.num_heads,
        num_key_value_heads=a.num_kv_heads,
        max_position_embeddings=a.max_position_embeddings,
        rope_parameters=rope,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        dtype="float32",
    )
    if a.family == "qwen2":
        return transformers.Qwen2Config(**common)
    if a.family == "llama3":
        return transformers.LlamaConfig(**common, head_dim=a.head_dim or a.hidden_size // a.num_heads)
    head_dim = a.head_dim or a.hidden_size // a.num_heads
    if a.family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=head_dim)
    # qwen3_moe: every layer sparse (decoder_sparse_step 1), as the tiny MoE checkpoints measured here
    return transformers.Qwen3MoeConfig(**common, head_dim=head_dim, num_experts=a.moe.num_experts,
                                       num_experts_per_tok=a.moe.top_k,
                                       moe_intermediate_size=a.moe.moe_intermediate_size,
                                       norm_topk_prob=a.moe.norm_topk_prob)


def build_model(preset: ModelPreset, out_dir: str | os.PathLike, *, progress: bool = True) -> Path:
    """Initialise, warm-start and save `preset` into `out_dir` (an HF checkpoint directory)."""
    import torch
    from transformers import AutoModelForCausalLM

    from seer.model.offset_heads import init_offset_heads
    from seer.model.tokenizer import build_tokenizer
    from seer.model.warm_start import warm_start

    t0, cpu0 = time.monotonic(), time.process_time()
    out = Path(out_dir)
    a = preset.arch
    torch.manual_seed(preset.init_seed)
    model = AutoModelForCausalLM.from_config(hf_config(a)).to(torch.float32)
    if preset.warm_start and preset.warm_start.offset_heads:
        init_offset_heads(model, preset.warm_start.offset_heads)
    tokenizer = build_tokenizer(model_max_length=a.max_position_embeddings)
    report = warm_start(model, tokenizer, preset.warm_start, progress=progress) if preset.warm_start else None
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {
        "preset": preset.name,
        "recipe_hash": recipe_hash(preset),
        "parameters": sum(t.numel() for t in model.parameters()),
        "warm_start": dataclasses.asdict(report) if report else None,
        "build_seconds": round(time.monotonic() - t0, 1),
        # CPU seconds over all threads: / threads estimates the wall time on idle cores
        "build_cpu_seconds": round(time.process_time() - cpu0, 1),
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return check_hf_checkpoint(out)
