import json

import pytest

from seer.types import PromptSpec
from seer.tasks import (
    DatasetError,
    PromptTooLongError,
    TaskConfig,
    encode_prompts,
    iteration_prompts,
    load_jsonl,
    load_task,
)
from seer.tasks.dataset import TaskRecord


class CharTokenizer:
    """Stands in for an HF tokenizer: one id per character."""

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}


def test_jsonl_prompt_field_and_reference(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "2+2=", "answer": 4}\n\n{"prompt": "3+3=", "answer": 6, "id": "x"}\n')
    records = load_jsonl(path)
    assert [r.text for r in records] == ["2+2=", "3+3="]
    assert records[1].reference == {"answer": 6, "id": "x"}
    assert [r.index for r in records] == [0, 1]


@pytest.mark.parametrize(
    "bad_line, expected",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"question": "x"}', "missing the prompt field 'prompt'"),
        ('{"prompt": 3}', "must be a non-empty string"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": "ok too"}\n' + bad_line + "\n")
    with pytest.raises(DatasetError) as e:
        load_jsonl(path)
    assert f"{path}:3" in str(e.value)
    assert expected in str(e.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatasetError, match="cannot read"):
        load_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no prompts"):
        load_jsonl(tmp_path / "empty.jsonl")


def test_user_task_needs_a_reward(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(DatasetError, match="reward"):
        load_task(TaskConfig(dataset=str(path)))
    task = load_task(TaskConfig(dataset=str(path), reward="seer.tasks.running_sum:score"))
    assert task.name == "d" and len(task.records) == 1


def test_builtin_task_loads_deterministically():
    a = load_task(TaskConfig(num_prompts=20, seed=4))
    b = load_task(TaskConfig(num_prompts=20, seed=4))
    assert a.records == b.records
    assert a.reward_spec == "seer.tasks.running_sum:score"
    with pytest.raises(DatasetError, match="unknown built-in task"):
        load_task(TaskConfig(name="nope"))


def test_prompt_longer_than_context_is_rejected_with_its_index():
    records = [TaskRecord(0, "short", {}), TaskRecord(1, "x" * 50, {})]
    assert len(encode_prompts(records[:1], CharTokenizer(), max_context=20)) == 1
    with pytest.raises(PromptTooLongError) as e:
        encode_prompts(records, CharTokenizer(), max_context=20)
    assert e.value.index == 1 and "prompt 1" in str(e.value)
    with pytest.raises(PromptTooLongError):  # fits, but not with the tokens it must generate
        encode_prompts(records[:1], CharTokenizer(), max_context=20, min_new_tokens=16)


def test_iteration_prompts_cover_an_epoch_without_repeats_and_are_reproducible():
    prompts = [PromptSpec(i, str(i), [i], {}) for i in range(10)]
    first = [p.index for it in range(5) for p in iteration_prompts(prompts, it, 2, seed=1)]
    assert sorted(first) == list(range(10))
    assert [p.index for p in iteration_prompts(prompts, 3, 2, seed=1)] == first[6:8]
    assert first != [p.index for it in range(5) for p in iteration_prompts(prompts, it, 2, seed=2)]
