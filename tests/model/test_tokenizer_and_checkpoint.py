import json

import pytest
from transformers import AutoTokenizer

from seer.model import CheckpointError, check_hf_checkpoint, get_preset, is_local_hf_checkpoint, recipe_hash, resolve_model
from seer.model.tokenizer import EOS_ID, build_tokenizer
from seer.tasks.running_sum import RunningSumConfig, generate_problems, solve


@pytest.fixture(scope="module", params=["tokenizer only", "beside a qwen2 config"])
def saved_tokenizer(request, tmp_path_factory):
    """Both ways AutoTokenizer loads it: on its own, and (as vLLM does) from a qwen2 checkpoint,
    where transformers substitutes its Qwen2Tokenizer class."""
    from transformers import Qwen2Config

    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(model_max_length=4096).save_pretrained(path)
    if request.param == "beside a qwen2 config":
        Qwen2Config(vocab_size=320).save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def test_round_trip_of_prompts_and_traces(saved_tokenizer):
    import random

    p = generate_problems(RunningSumConfig(num_prompts=1, seed=0))[0]
    text = p.text + solve(p.reference, random.Random(0))
    ids = saved_tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, nothing added
    assert ids == build_tokenizer(4096)(text)["input_ids"]
    assert saved_tokenizer.decode(ids) == text


def test_any_text_round_trips_one_token_per_byte(saved_tokenizer):
    text = "a  b\n\tc é ü 日本 \r\n"
    ids = saved_tokenizer(text)["input_ids"]
    assert len(ids) == len(text.encode())
    assert saved_tokenizer.unk_token_id not in ids
    assert saved_tokenizer.decode(ids) == text


def test_special_tokens(saved_tokenizer):
    assert saved_tokenizer.eos_token_id == EOS_ID
    assert saved_tokenizer.pad_token_id is not None and saved_tokenizer.bos_token_id is not None
    assert len(saved_tokenizer) <= 320  # fits the model's vocab_size
    assert saved_tokenizer.decode(saved_tokenizer("12\n")["input_ids"] + [EOS_ID], skip_special_tokens=True) == "12\n"


def test_checkpoint_check_names_what_is_missing(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        check_hf_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError) as e:
        check_hf_checkpoint(tmp_path)
    for missing in ("config.json", "no weights", "tokenizer_config.json", "no tokenizer model"):
        assert missing in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    build_tokenizer(64).save_pretrained(tmp_path)
    assert is_local_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        check_hf_checkpoint(tmp_path)


def test_resolve_model_rejects_a_bad_directory(tmp_path):
    with pytest.raises(CheckpointError):
        resolve_model(str(tmp_path))


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(ValueError, match="known presets: default, tiny"):
        get_preset("huge")


def test_recipe_hash_tracks_the_recipe():
    import dataclasses

    tiny = get_preset("tiny")
    changed = dataclasses.replace(tiny, warm_start=dataclasses.replace(tiny.warm_start, lr=tiny.warm_start.lr * 2))
    assert recipe_hash(tiny) == recipe_hash(get_preset("tiny"))
    assert recipe_hash(changed) != recipe_hash(tiny)
    assert recipe_hash(get_preset("default")) != recipe_hash(tiny)


def test_recipe_hash_includes_the_isa_pins(monkeypatch):
    """A cache built under other pins (or none: the host's ISA) is never reused as this build."""
    from seer.model import build

    tiny = get_preset("tiny")
    pinned = recipe_hash(tiny)
    monkeypatch.setattr(build, "ISA_PINS", {**build.ISA_PINS, "ATEN_CPU_CAPABILITY": "avx512"})
    assert recipe_hash(tiny) != pinned
    monkeypatch.setattr(build, "ISA_PINS", {})
    assert recipe_hash(tiny) != pinned


def test_every_preset_survives_the_trip_to_the_build_process():
    """build_pinned sends the preset as JSON: each arrives equal, with the same recipe hash."""
    from seer.model.build import preset_from_json, preset_to_json
    from seer.model.presets import PRESETS

    for p in PRESETS.values():
        back = preset_from_json(preset_to_json(p))
        assert back == p and recipe_hash(back) == recipe_hash(p), p.name
