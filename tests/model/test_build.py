"""Builds the tiny preset once (~30 s on two idle cores) into a fresh cache directory."""

import json
import os
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from seer.model import ensure_model, is_local_hf_checkpoint, model_dir, resolve_model
from seer.model.build import BUILD_CAPABILITY, BUILD_INFO, ISA_PINS, weights_mismatch


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("seer-cache")


@pytest.fixture(scope="module")
def tiny(cache):
    return ensure_model("tiny", cache_dir=cache, progress=False)


def test_tiny_builds_into_the_cache_as_an_hf_checkpoint(tiny, cache):
    assert tiny == model_dir("tiny", cache)
    assert tiny.parent == cache / "models"
    assert is_local_hf_checkpoint(tiny)
    info = json.loads((tiny / BUILD_INFO).read_text())
    assert info["preset"] == "tiny" and info["warm_start"]["steps"] > 0
    assert info["warm_start"]["final_loss"] < info["warm_start"]["first_loss"]
    assert not [p for p in tiny.parent.iterdir() if p.name.startswith(".tmp-")]  # no half-built leftovers


def test_tiny_is_built_at_the_pinned_isa_into_the_recorded_weights(tiny):
    """The build process ran at AVX2 with every pin set, while this process runs torch at whatever
    the host has (AVX-512 here): the weights are the recorded ones, bit for bit."""
    info = json.loads((tiny / BUILD_INFO).read_text())
    assert info["cpu_capability"] == BUILD_CAPABILITY and info["isa_pins"] == ISA_PINS
    assert weights_mismatch(tiny) is None, weights_mismatch(tiny)


def test_build_process_refuses_to_run_below_the_pinned_isa(tmp_path):
    """A CPU without AVX2 runs ATen at DEFAULT: the build stops with a clear error instead of
    making weights no other machine makes (ATEN_CPU_CAPABILITY=default stands in for that CPU)."""
    import subprocess
    import sys

    from seer.model.build import preset_to_json, recipe_hash
    from seer.model.presets import get_preset

    p = get_preset("tiny-qwen3")
    r = subprocess.run([sys.executable, "-c", "import sys; from seer.model.build import _main; sys.exit(_main(sys.argv[1:]))",
                        str(tmp_path / "out"), recipe_hash(p), "--quiet"], input=preset_to_json(p), text=True,
                       capture_output=True, env={**os.environ, **ISA_PINS, "ATEN_CPU_CAPABILITY": "default"}, timeout=300)
    assert r.returncode == 3, r.stderr
    assert "built with AVX2 kernels" in r.stderr and "runs at DEFAULT" in r.stderr and "checkpoint directory" in r.stderr
    assert not (tmp_path / "out").exists()


def test_tiny_loads_with_auto_classes_and_generates(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.num_key_value_heads < cfg.num_attention_heads
    assert next(model.parameters()).dtype == torch.float32
    assert model.generation_config.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok("Start at 37, add digits 1-9 until the total reaches 60.\n")["input_ids"]])
    out = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_second_call_reuses_the_cache(tiny, cache):
    stamp = (tiny / "model.safetensors").stat().st_mtime_ns
    t0 = time.monotonic()
    again = ensure_model("tiny", cache_dir=cache, progress=False)
    assert again == tiny
    assert time.monotonic() - t0 < 1.0
    assert (tiny / "model.safetensors").stat().st_mtime_ns == stamp


def test_cache_dir_comes_from_the_environment(tiny, cache, monkeypatch):
    monkeypatch.setenv("SEER_CACHE_DIR", str(cache))
    assert resolve_model("tiny") == tiny
    assert resolve_model(str(tiny)) == tiny.resolve()


@pytest.mark.parametrize("preset, model_type", [("tiny-qwen3", "qwen3"), ("tiny-llama3", "llama"),
                                                ("tiny-qwen3-moe", "qwen3_moe")])
def test_untrained_family_presets_build_in_seconds(preset, model_type, cache):
    """Tests' checkpoints of each family: no download, no warm start, the embedded tokenizer."""
    t0 = time.monotonic()
    path = ensure_model(preset, cache_dir=cache, progress=False)
    assert time.monotonic() - t0 < 60  # seconds on idle cores; generous for a loaded machine
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == model_type and config["head_dim"] == 32
    assert json.loads((path / BUILD_INFO).read_text())["warm_start"] is None
    assert AutoTokenizer.from_pretrained(path).eos_token_id == config["eos_token_id"]
    assert weights_mismatch(path) is None, weights_mismatch(path)  # their init is pinned too
    if model_type == "llama":
        assert config["rope_parameters"]["rope_type"] == "llama3"
    if model_type != "qwen3_moe":  # the trainer's families (Qwen3-MoE comes with the MoE work)
        from seer.trainer.hf_mapping import HFArch

        arch = HFArch.from_dir(path)
        assert arch.qk_norm == (model_type == "qwen3") and (arch.rope_scaling is not None) == (model_type == "llama")
