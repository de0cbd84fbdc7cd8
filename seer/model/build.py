"""Builds the embedded default model into a cache directory, once.

Nothing can be downloaded, so Seer makes its own small Qwen2 model and tokenizer on first use.
The directory name carries a hash of the whole build recipe; building happens in a temporary
directory renamed into place, under a file lock, so concurrent first uses (tests, several
processes) build once and never see a half-written model.

The build runs in a fresh Python process whose environment pins each math library's instruction
set before it loads (ISA_PINS): the same recipe then gives the same weights, bit for bit, on every
x86-64 CPU with AVX2, whatever the host's widest vector unit (docs/models.md, "Same weights on
every CPU").
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seer.model.checkpoint import check_hf_checkpoint
from seer.model.presets import ArchSpec, ModelPreset, get_preset
from seer.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB
from seer.tasks import calculator, running_sum

RECIPE_VERSION = 1  # bump when build code changes what it produces
BUILD_INFO = "seer_build.json"

# Set in the build process's environment, read by each library when it loads. Without them ATen
# (its vectorized kernels: softmax, norms, AdamW, SDPA) and MKL (sgemm on Intel CPUs) pick the
# widest unit the CPU has, and AVX-512's other blocking and reduction order gave other weights
# (tests/test_learning.py failed on such a machine). AVX2 is what every CPU that runs vLLM's CPU
# backend has. MKL on an AMD CPU ignores its two settings and takes its one AMD path (checked here:
# neither changes a bit of an sgemm on an EPYC, while ATen's does); oneDNN runs no primitive in the
# build, its cap is for a torch that would route one there.
ISA_PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",  # conditional numerical reproducibility on the AVX2 branch, strict
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
BUILD_CAPABILITY = "AVX2"  # torch.backends.cpu.get_cpu_capability() the build must run at
BUILD_THREADS = 2  # the whole build's intra-op threads (the warm start sets its spec's own)


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
        "isa_pins": ISA_PINS,  # caches built before the pins (host ISA) are never reused
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
            build_pinned(p, tmp, progress=progress)
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
        # the kernels it ran on: build_pinned's process reads AVX2 and the pins on every host
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_pins": {k: os.environ.get(k) for k in ISA_PINS},
        "torch": torch.__version__,
        "build_seconds": round(time.monotonic() - t0, 1),
        # CPU seconds over all threads: / threads estimates the wall time on idle cores
        "build_cpu_seconds": round(time.process_time() - cpu0, 1),
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return check_hf_checkpoint(out)


class BuildError(RuntimeError):
    """The pinned build process failed or could not run at the pinned instruction set."""


def preset_to_json(p: ModelPreset) -> str:
    """The preset as plain data for the build process (the warm-start task tagged by its kind)."""
    d = dataclasses.asdict(p)
    if p.warm_start is not None:
        d["warm_start"]["task_kind"] = "calculator" if isinstance(p.warm_start.task, calculator.CalcTaskConfig) else "running_sum"
    return json.dumps(d)


def preset_from_json(text: str) -> ModelPreset:
    from seer.model.presets import Llama3Rope, MoESpec, WarmStartSpec

    d = json.loads(text)
    a = dict(d["arch"])
    a["llama3_rope"] = Llama3Rope(**a["llama3_rope"]) if a.get("llama3_rope") else None
    a["moe"] = MoESpec(**a["moe"]) if a.get("moe") else None
    ws = None
    if d["warm_start"] is not None:
        w = dict(d["warm_start"])
        task_cls = calculator.CalcTaskConfig if w.pop("task_kind") == "calculator" else running_sum.RunningSumConfig
        ws = WarmStartSpec(**{**w, "task": task_cls(**w["task"]), "offset_heads": tuple(w["offset_heads"])})
    return ModelPreset(name=d["name"], arch=ArchSpec(**a), warm_start=ws, init_seed=d["init_seed"])


def build_pinned(preset: ModelPreset, out_dir: str | os.PathLike, *, progress: bool = True) -> Path:
    """build_model in a fresh process with ISA_PINS in its environment (the libraries read them
    once, when they load: this process may already run torch at AVX-512)."""
    env = {**os.environ, **ISA_PINS}
    cmd = [sys.executable, "-c", "import sys; from seer.model.build import _main; sys.exit(_main(sys.argv[1:]))",
           str(out_dir), recipe_hash(preset)] + ([] if progress else ["--quiet"])
    r = subprocess.run(cmd, input=preset_to_json(preset), text=True, env=env,
                       stdout=None if progress else subprocess.PIPE, stderr=None if progress else subprocess.STDOUT)
    if r.returncode != 0:
        shown = f":\n{r.stdout[-4000:]}" if r.stdout else " (its output is above)"
        raise BuildError(f"building model preset {preset.name!r} failed (build process exit {r.returncode}){shown}")
    return check_hf_checkpoint(Path(out_dir))


def _main(argv: list[str]) -> int:
    """The build process (build_pinned's command): OUT_DIR RECIPE_HASH [--quiet], the preset as
    JSON on stdin (ISA_PINS in the environment, as build_pinned sets them)."""
    import torch

    out, expected_hash = argv[0], argv[1]
    preset = preset_from_json(sys.stdin.read())
    if recipe_hash(preset) != expected_hash:  # the JSON round trip lost or changed a field
        print(f"preset {preset.name!r} arrived with recipe hash {recipe_hash(preset)}, sent {expected_hash}", file=sys.stderr)
        return 2
    unset = {k: v for k, v in ISA_PINS.items() if os.environ.get(k) != v}
    capability = torch.backends.cpu.get_cpu_capability()
    if unset or capability != BUILD_CAPABILITY:
        print(f"the embedded models are built with {BUILD_CAPABILITY} kernels so that every machine builds the same "
              f"weights, but this build process runs at {capability}"
              + (f" with {', '.join(unset)} not set as {ISA_PINS}" if unset else " (this CPU lacks AVX2?)")
              + "; give `model` a checkpoint directory instead of a preset", file=sys.stderr)
        return 3
    torch.set_num_threads(BUILD_THREADS)
    build_model(preset, out, progress="--quiet" not in argv[2:])
    return 0


def weights_mismatch(model_dir: str | os.PathLike) -> str | None:
    """None if the built preset in `model_dir` has its recorded weights (presets.WEIGHTS_SHA256),
    else what differs: the digest and how the build ran, against how the record was made."""
    from seer.model.presets import WEIGHTS_SHA256, WEIGHTS_TORCH

    d = Path(model_dir)
    info = json.loads((d / BUILD_INFO).read_text())
    want = WEIGHTS_SHA256.get(info["preset"])
    got = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    if want is None or got == want:
        return None
    ran = {k: info.get(k) for k in ("recipe_hash", "cpu_capability", "isa_pins", "torch")}
    return (f"{info['preset']}'s model.safetensors has sha256 {got}, recorded {want} (seer/model/presets.py "
            f"WEIGHTS_SHA256, built at capability {BUILD_CAPABILITY} with ISA_PINS on torch {WEIGHTS_TORCH}); this build: "
            f"{ran}, warm-start final loss {(info.get('warm_start') or {}).get('final_loss')}")
