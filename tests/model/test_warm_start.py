import dataclasses

import pytest

from seer.model import get_preset
from seer.model.tokenizer import EOS_ID, build_tokenizer
from seer.model.warm_start import IGNORE, WIDTHS, _batches, _collate, _examples


@pytest.fixture(scope="module")
def examples():
    spec = dataclasses.replace(get_preset("tiny").warm_start, train_prompts=300)
    return _examples(spec, build_tokenizer(4096))


def test_examples_end_with_eos_and_are_deterministic(examples):
    spec = dataclasses.replace(get_preset("tiny").warm_start, train_prompts=300)
    assert all(e.input_ids[-1] == EOS_ID for e in examples)
    assert examples == _examples(spec, build_tokenizer(4096))


def test_batches_use_few_fixed_shapes_and_cover_every_example(examples):
    batches = _batches(examples, 1024, seed=0)
    shapes = {tuple(_collate(b, 0)["input_ids"].shape) for b in batches}
    assert len(shapes) <= len(WIDTHS)  # one (rows, width) per bucket: no per-step oneDNN set-up
    seen = {id(e) for b in batches for e in b}
    assert seen == {id(e) for e in examples}
    assert [len(b) for b in batches] == [len(b) for b in _batches(examples, 1024, seed=0)]


def test_loss_is_on_the_response_only(examples):
    e = examples[0]
    batch = _collate([e], pad_id=0)
    labels = batch["labels"][0]
    assert (labels[: e.prompt_len] == IGNORE).all()
    assert labels[e.prompt_len : len(e.input_ids)].tolist() == e.input_ids[e.prompt_len :]
    assert (labels[len(e.input_ids) :] == IGNORE).all()
    assert batch["attention_mask"][0].sum() == len(e.input_ids)


def test_noisy_demonstrations_restate_the_start_line_in_the_given_share():
    """The default preset's demonstrations carry a habit RL must unlearn (WarmStartSpec.restate_fraction)."""
    tok = build_tokenizer(4096)
    spec = dataclasses.replace(get_preset("default").warm_start, train_prompts=1000)
    assert spec.restate_fraction > 0
    restated = 0
    for e in _examples(spec, tok):
        prompt, response = tok.decode(e.input_ids[: e.prompt_len]), tok.decode(e.input_ids[e.prompt_len : -1])
        start_line = prompt.strip().split("\n")[-1]
        restated += response.startswith(start_line + "\n")
    assert abs(restated / 1000 - spec.restate_fraction) < 0.05
    clean = dataclasses.replace(spec, restate_fraction=0.0)
    assert all(not tok.decode(e.input_ids[e.prompt_len :]).startswith("start=") for e in _examples(clean, tok))
