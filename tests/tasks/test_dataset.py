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
        # chat records: `messages` instead of the prompt field
        ('{"messages": []}', "'messages' must be a non-empty list"),
        ('{"messages": "hi"}', "'messages' must be a non-empty list"),
        ('{"messages": [{"role": "user"}]}', "messages[0].content must be a string"),
        ('{"messages": [3]}', "messages[0] must be an object"),
        ('{"messages": [{"role": "user", "content": "x"}], "prompt": "y"}', "both the prompt field"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"messages": [{"role": "user", "content": "ok too"}]}\n' + bad_line + "\n")
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


# -- task.loader: a function returning records ---------------------------------------------------------

PLUG = "tests.plugins_for_tests"


def test_loader_records_have_the_jsonl_shape():
    task = load_task(TaskConfig(loader=f"{PLUG}:sums", loader_args={"n": 4, "offset": 10},
                                reward="seer.tasks.running_sum:score"))
    assert task.name == "sums" and [r.index for r in task.records] == [0, 1, 2, 3]
    assert task.records[1].text == "loader prompt 1: 11 + 1 =" and task.records[1].reference == {"answer": 12}
    # the same records as the same lines in a JSONL file
    assert [(r.text, r.reference) for r in task.records] == [(r.text, r.reference) for r in _as_jsonl(task.records)]


def _as_jsonl(records):
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in records:
            f.write(json.dumps({"prompt": r.text, **r.reference}) + "\n")
    return load_jsonl(f.name)


@pytest.mark.parametrize("cfg, says", [
    (dict(loader=f"{PLUG}:broken"), "record 1: missing the prompt field 'prompt'"),
    (dict(loader=f"{PLUG}:not_a_list"), "returned a int; expected a list of records"),
    (dict(loader=f"{PLUG}:sums", loader_args={"n": 0}), "returned no records"),
    (dict(loader=f"{PLUG}:sums", loader_args={"count": 2}), "task.loader_args: sums does not take"),
    (dict(loader=f"{PLUG}:nope"), "task.loader 'tests.plugins_for_tests:nope': module"),
    (dict(loader="sums"), "must look like 'package.module:function'"),
    (dict(loader=f"{PLUG}:sums", dataset="x.jsonl"), "not both"),
    (dict(loader_args={"n": 1}), "task.loader_args are the arguments of task.loader"),
    (dict(loader=f"{PLUG}:sums", reward=None), "needs a reward function"),
])
def test_bad_loader_is_a_clear_error(cfg, says):
    cfg = {"reward": "seer.tasks.running_sum:score", **cfg}
    with pytest.raises(DatasetError) as e:
        load_task(TaskConfig(**cfg))
    assert says in str(e.value)


def test_loader_record_with_a_bad_field_names_the_index_and_field():
    from seer.tasks.dataset import parse_record
    with pytest.raises(DatasetError, match=r"record 4: the prompt field 'prompt' must be a non-empty string"):
        parse_record({"prompt": ""}, "task.loader 'p:f' record 4", 4)
    with pytest.raises(DatasetError, match=r"record 2: messages\[1\]\.content must be a string"):
        parse_record({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}, "task.loader 'p:f' record 2", 2)


# -- chat records: `messages` rendered with a chat template ----------------------------------------------

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_chat_records_render_with_the_template_from_the_key(tmp_path, tiny_model):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert not tok.chat_template  # the embedded model has none: the key supplies it
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+2"}],
                                "answer": 4}) + "\n" + json.dumps({"prompt": "plain 1+1=", "answer": 2}) + "\n")
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    for given in (TEMPLATE, str(tmp_path / "t.jinja")):  # a jinja string, or a file holding one
        task = load_task(TaskConfig(dataset=str(path), reward="seer.tasks.running_sum:score", chat_template=given))
        chat, plain = encode_prompts(task.records, tok, max_context=4096)
        assert chat.text == "<|system|>Add.\n<|user|>2+2\n<|assistant|>"
        assert chat.prompt_ids == tok(chat.text, add_special_tokens=False)["input_ids"]
        assert chat.prompt_ids == list(tok.apply_chat_template(
            list(task.records[0].messages), add_generation_prompt=True, tokenize=True, chat_template=TEMPLATE,
            return_dict=False))
        assert chat.reference == {"answer": 4}
        assert plain.text == "plain 1+1=" and plain.prompt_ids == tok("plain 1+1=")["input_ids"]  # untouched


def test_chat_record_without_any_template_says_which_key_to_set(tmp_path, tiny_model):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model)
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "2+2"}]}) + "\n")
    task = load_task(TaskConfig(dataset=str(path), reward="seer.tasks.running_sum:score"))
    with pytest.raises(DatasetError) as e:
        encode_prompts(task.records, tok, max_context=4096)
    assert f"{path}:1" in str(e.value) and "no chat template" in str(e.value) and "task.chat_template" in str(e.value)


def test_chat_template_key_that_is_neither_template_nor_file():
    with pytest.raises(DatasetError, match="task.chat_template 'nowhere.jinja' is neither"):
        load_task(TaskConfig(loader=f"{PLUG}:chats", reward="seer.tasks.running_sum:score", chat_template="nowhere.jinja"))


# -- iteration_prompts: one shuffle per epoch ------------------------------------------------------------

def test_iteration_prompts_cover_each_prompt_once_per_epoch_across_iteration_boundaries():
    prompts = [PromptSpec(i, str(i), [i], {}) for i in range(7)]
    draws = [p.index for it in range(12) for p in iteration_prompts(prompts, it, 3, seed=5)]  # 36 = 5 epochs + 1
    for e in range(5):
        assert sorted(draws[7 * e: 7 * e + 7]) == list(range(7))
    assert len({tuple(draws[7 * e: 7 * e + 7]) for e in range(5)}) > 1  # each epoch its own order
    again = [p.index for it in range(12) for p in iteration_prompts(prompts, it, 3, seed=5)]
    assert draws == again  # deterministic
    # a pure function of (prompts, iteration, count, seed): a resumed run draws the same, in any call order
    assert [p.index for p in iteration_prompts(prompts, 9, 3, seed=5)] == draws[27:30]


def test_iteration_prompts_keep_the_order_earlier_runs_drew():
    """Resuming a run started before the epoch cache must give it the same prompts."""
    import random
    prompts = [PromptSpec(i, str(i), [i], {}) for i in range(10)]
    old = []
    for pos in range(4 * 6, 4 * 6 + 6):
        epoch, offset = divmod(pos, 10)
        order = list(range(10))
        random.Random(f"epoch:3:{epoch}").shuffle(order)
        old.append(order[offset])
    assert [p.index for p in iteration_prompts(prompts, 4, 6, seed=3)] == old


def test_iteration_draw_from_a_large_dataset_is_fast():
    import time
    prompts = [PromptSpec(i, "", [1], {}) for i in range(100_000)]
    t0 = time.perf_counter()
    first = iteration_prompts(prompts, 0, 16, seed=11)  # pays the epoch's one shuffle
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for it in range(1, 101):
        iteration_prompts(prompts, it, 16, seed=11)
    per_draw = (time.perf_counter() - t0) / 100
    assert per_draw < 0.005, per_draw  # was one shuffle of the whole dataset per prompt drawn (~1 s)
    assert first_s < 0.5, first_s
    assert len({p.index for p in first}) == 16
