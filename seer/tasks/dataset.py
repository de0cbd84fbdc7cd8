"""Task datasets: the built-in running-sum family, a user's JSONL file or loader function, and prompt encoding.

A task is prompts plus the reward function that scores them; the reward is named by a
`module:function` string (so it can travel to a worker process and into a run's config).

A record (a JSONL line, or a mapping a `task.loader` function returns) holds its prompt under
`task.prompt_field` ("prompt"), or a chat under `messages` ([{role, content}, ...]), which is
rendered with the tokenizer's chat template (or `task.chat_template`); every other key is the
reference handed to the reward function.
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seer.plugins import PluginError, check_arguments, resolve
from seer.types import PromptSpec
from seer.tasks.reward import RewardFn, resolve_reward_fn
from seer.tasks import calculator
from seer.tasks.calculator import CalcTaskConfig
from seer.tasks.running_sum import RunningSumConfig, generate_problems

BUILTIN_TASKS = ("running_sum", "calculator")
RUNNING_SUM_REWARD = "seer.tasks.running_sum:score"
CALCULATOR_REWARD = "seer.tasks.calculator:score"  # the calculator environment's reward, from the text
ENV_FALLBACK_REWARD = "seer.tasks.env:zero_reward"  # an environment task without task.reward


class DatasetError(ValueError):
    """A dataset that cannot be loaded; the message names the file and line (a loader's record index)."""


class PromptTooLongError(ValueError):
    """A prompt that leaves no room to generate within the model's context."""

    def __init__(self, index: int, length: int, max_context: int):
        super().__init__(
            f"prompt {index} has {length} tokens, which leaves no room to generate within the "
            f"model's max context of {max_context} tokens"
        )
        self.index, self.length, self.max_context = index, length, max_context


@dataclass(frozen=True)
class TaskRecord:
    """One prompt before tokenization: its text, or chat `messages` to render with a chat template."""

    index: int
    text: str  # "" for a chat record
    reference: dict
    messages: tuple[dict, ...] | None = None  # [{role, content}, ...] instead of text
    # The jinja template `messages` are rendered with (task.chat_template); None: the tokenizer's own.
    chat_template: str | None = None
    source: str = ""  # where the record came from ("data.jsonl:3", "task.loader 'pkg:fn' record 2"), for errors


@dataclass(frozen=True)
class TaskConfig:
    """What the run config says about the task: a user task (`dataset` or `loader`, and then a
    `reward`), or the built-in `name` when neither is set."""

    name: str = "running_sum"  # the built-in task (used when neither dataset nor loader is set)
    dataset: str | None = None  # path of a JSONL file; then `reward` is required
    # "module:function" returning the dataset's records (a list of mappings shaped like JSONL lines),
    # called with `loader_args` as keywords; instead of `dataset`, and `reward` is required
    loader: str | None = None
    loader_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of `loader`
    reward: str | None = None  # "module:function"; defaults to the built-in task's reward
    prompt_field: str = "prompt"  # the key of each record that holds the prompt text
    # For records with `messages`: a jinja chat template, or the path of a file holding one; None:
    # the tokenizer's own (an error if it has none)
    chat_template: str | None = None
    num_prompts: int = RunningSumConfig.num_prompts  # built-in task only
    seed: int = 0  # built-in task only
    median_steps: float = RunningSumConfig.median_steps  # built-in task only: median reasoning steps per prompt
    sigma: float = RunningSumConfig.sigma  # built-in task only: lognormal spread of the step count
    # The multi-turn environment, "package.module:Class" or a built-in name (calculator); setting
    # it selects the multi-turn rollout (seer.rollout.multi_turn). The calculator task sets it itself.
    env: str | None = None
    # Keyword arguments of the environment's constructor (calculator: latency_median_s, latency_sigma)
    env_args: dict[str, Any] = field(default_factory=dict)
    # The agent that plays each session through the OpenAI-compatible gateway instead of an
    # environment (docs/agents.md): "package.module:function" (an async function of base_url, api_key,
    # session_id, record) or a command line; setting it selects the gateway rollout (seer.rollout.gateway)
    agent: str | None = None
    agent_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of a function agent
    median_turns: float = CalcTaskConfig.median_turns  # built-in calculator task only: median calculator calls per prompt
    turns_sigma: float = CalcTaskConfig.sigma  # built-in calculator task only: lognormal spread of the turn count


@dataclass(frozen=True)
class Task:
    name: str
    records: list[TaskRecord]
    reward_spec: str  # "module:function"
    reward_fn: RewardFn
    env: str | None = None  # multi-turn: the environment (task.env), None for single-turn
    env_args: dict = field(default_factory=dict)


def load_task(cfg: TaskConfig) -> Task:
    """The task a run config describes, with its reward function already resolved (fails early)."""
    if cfg.dataset is not None and cfg.loader is not None:
        raise DatasetError("set task.dataset (a JSONL file) or task.loader (a function), not both")
    if cfg.loader_args and cfg.loader is None:
        raise DatasetError("task.loader_args are the arguments of task.loader, which is not set")
    if cfg.dataset is not None or cfg.loader is not None:
        what = f"dataset {cfg.dataset}" if cfg.dataset is not None else f"task.loader {cfg.loader!r}"
        if not cfg.reward and not cfg.env:
            raise DatasetError(f"{what} needs a reward function: set task.reward to 'module:function'")
        template = chat_template_text(cfg.chat_template)
        if cfg.dataset is not None:
            records = load_jsonl(cfg.dataset, prompt_field=cfg.prompt_field, chat_template=template)
            name = Path(cfg.dataset).stem
        else:
            records = load_records(cfg.loader, cfg.loader_args, prompt_field=cfg.prompt_field, chat_template=template)
            name = cfg.loader.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        reward = cfg.reward or ENV_FALLBACK_REWARD
        return Task(name, records, reward, resolve_reward_fn(reward), cfg.env, dict(cfg.env_args))
    if cfg.name not in BUILTIN_TASKS:
        raise DatasetError(f"unknown built-in task {cfg.name!r}; known: {', '.join(BUILTIN_TASKS)} "
                           "(or set task.dataset or task.loader)")
    if cfg.name == "calculator":
        problems = calculator.generate_problems(calculator.CalcTaskConfig(
            num_prompts=cfg.num_prompts, seed=cfg.seed, median_turns=cfg.median_turns, sigma=cfg.turns_sigma))
        records = [TaskRecord(i, p.text, p.reference) for i, p in enumerate(problems)]
        reward = cfg.reward or CALCULATOR_REWARD
        return Task(cfg.name, records, reward, resolve_reward_fn(reward), cfg.env or "calculator", dict(cfg.env_args))
    records = running_sum_records(
        RunningSumConfig(num_prompts=cfg.num_prompts, seed=cfg.seed, median_steps=cfg.median_steps, sigma=cfg.sigma)
    )
    reward = cfg.reward or RUNNING_SUM_REWARD
    return Task(cfg.name, records, reward, resolve_reward_fn(reward), cfg.env, dict(cfg.env_args))


def resolve_loader(spec: str, args: Mapping[str, Any] = {}):
    """The `task.loader` function, checked to take `task.loader_args` (DatasetError naming the key)."""
    try:
        fn = resolve(spec, key="task.loader")
        check_arguments(fn, args, key="task.loader_args")
    except PluginError as e:
        raise DatasetError(str(e)) from None
    return fn


def load_records(spec: str, args: Mapping[str, Any] = {}, *, prompt_field: str = TaskConfig.prompt_field,
                 chat_template: str | None = None) -> list[TaskRecord]:
    """Call the `task.loader` function `spec` with `args` and check what it returns, naming the
    record index and the field of any malformed record (as a JSONL line gets file:line)."""
    fn = resolve_loader(spec, args)
    try:
        out = fn(**args)
    except Exception as e:  # the user's function may raise anything
        raise DatasetError(f"task.loader {spec!r} raised {type(e).__name__}: {e}") from e
    if isinstance(out, (str, bytes, Mapping)) or not hasattr(out, "__iter__"):
        raise DatasetError(f"task.loader {spec!r} returned a {type(out).__name__}; expected a list of records "
                           f"(mappings with {prompt_field!r} or 'messages')")
    records = [parse_record(obj, f"task.loader {spec!r} record {i}", i, prompt_field, chat_template)
               for i, obj in enumerate(out)]
    if not records:
        raise DatasetError(f"task.loader {spec!r} returned no records")
    return records


def chat_template_text(value: str | None) -> str | None:
    """`task.chat_template`: a jinja template as is, or the path of a file holding one."""
    if value is None:
        return None
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise DatasetError(f"task.chat_template {value!r} is neither a jinja template (no '{{{{' or '{{%') "
                           "nor an existing file")
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"task.chat_template: cannot read {path}: {e.strerror}") from None


def running_sum_records(cfg: RunningSumConfig) -> list[TaskRecord]:
    return [TaskRecord(i, p.text, p.reference) for i, p in enumerate(generate_problems(cfg))]


def load_jsonl(path: str | os.PathLike, *, prompt_field: str = TaskConfig.prompt_field,
               chat_template: str | None = None) -> list[TaskRecord]:
    """One JSON object per non-blank line; `prompt_field` (or `messages`) is the prompt, every other key the reference."""
    records = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e.strerror}") from None
    with f:
        for lineno, line in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            records.append(parse_record(obj, where, len(records), prompt_field, chat_template))
    if not records:
        raise DatasetError(f"{path}: the dataset has no prompts")
    return records


def parse_record(obj: Any, where: str, index: int, prompt_field: str = TaskConfig.prompt_field,
                 chat_template: str | None = None) -> TaskRecord:
    """A JSONL line's object or a loader's mapping as a TaskRecord; DatasetError naming `where` and the field."""
    if not isinstance(obj, Mapping):
        raise DatasetError(f"{where}: expected a JSON object (a mapping), got {type(obj).__name__}")
    ref = dict(obj)
    if prompt_field in ref and "messages" in ref:
        raise DatasetError(f"{where}: has both the prompt field {prompt_field!r} and 'messages'; keep one")
    if "messages" in ref:
        return TaskRecord(index, "", ref, _messages(ref.pop("messages"), where), chat_template, where)
    if prompt_field not in ref:
        raise DatasetError(f"{where}: missing the prompt field {prompt_field!r} (or chat 'messages')")
    text = ref.pop(prompt_field)
    if not isinstance(text, str) or not text:
        raise DatasetError(f"{where}: the prompt field {prompt_field!r} must be a non-empty string")
    return TaskRecord(index, text, ref, source=where)


def _messages(value: Any, where: str) -> tuple[dict, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise DatasetError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise DatasetError(f"{where}: messages[{i}] must be an object with role and content, got {type(m).__name__}")
        for k in ("role", "content"):
            if not isinstance(m.get(k), str):
                raise DatasetError(f"{where}: messages[{i}].{k} must be a string, got {m.get(k)!r}")
    return tuple(dict(m) for m in value)


def encode_prompts(records: list[TaskRecord], tokenizer, max_context: int, *, min_new_tokens: int = 1) -> list[PromptSpec]:
    """Tokenize with the model's own tokenizer: a text prompt as is (its default special tokens,
    no chat template); a chat record's `messages` rendered with its chat template (the record's,
    from task.chat_template, else the tokenizer's) and a generation prompt.

    Rejects, naming the index, any prompt that leaves fewer than `min_new_tokens` positions of
    `max_context`: better at load time than as a failed request mid-iteration.
    """
    specs = []
    for r in records:
        if r.messages is not None:
            text, ids = render_chat(r, tokenizer)
        else:
            text, ids = r.text, list(tokenizer(r.text)["input_ids"])
        if len(ids) + min_new_tokens > max_context:
            raise PromptTooLongError(r.index, len(ids), max_context)
        specs.append(PromptSpec(index=r.index, text=text, prompt_ids=ids, reference=r.reference))
    return specs


def render_chat(record: TaskRecord, tokenizer) -> tuple[str, list[int]]:
    """A chat record's prompt text and ids: apply_chat_template(messages, add_generation_prompt=True),
    tokenized as apply_chat_template(tokenize=True) does (the template brings its own special tokens)."""
    template = record.chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DatasetError(
            f"{record.source or f'record {record.index}'}: a chat record ('messages'), but the tokenizer of "
            f"{name} has no chat template; set task.chat_template: <path of a jinja file, or a jinja string>")
    try:
        text = tokenizer.apply_chat_template(list(record.messages), add_generation_prompt=True, tokenize=False,
                                             chat_template=template)
    except Exception as e:  # jinja errors: a template that does not fit the messages
        raise DatasetError(f"{record.source or f'record {record.index}'}: rendering the chat template failed: "
                           f"{type(e).__name__}: {e}") from e
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def iteration_prompts(prompts: list[PromptSpec], iteration: int, count: int, *, seed: int = 0) -> list[PromptSpec]:
    """The `count` prompts of `iteration`: epochs over a seeded shuffle, so a resumed run gets the same ones.

    Draw position p = iteration * count + k is offset p mod n of epoch p // n, and each epoch
    is its own seeded permutation of the n prompts: every prompt once per epoch, and the result
    a pure function of (prompts, iteration, count, seed). An epoch's permutation is computed
    once and cached, so a draw costs O(count) after the first one of its epoch.
    """
    return draw_prompts(prompts, iteration * count, count, seed=seed)


def draw_prompts(prompts: list[PromptSpec], start: int, count: int, *, seed: int = 0) -> list[PromptSpec]:
    """The `count` prompts at draw positions start, start + 1, ... of the seeded epoch stream
    (`iteration_prompts` is position iteration * count). A run whose iterations consume other than
    `count` prompts (rollout.dynamic_sampling) keeps its position, the prompt cursor, in loop_state.json."""
    if not prompts:
        raise ValueError("no prompts")
    n = len(prompts)
    out: list[PromptSpec] = []
    for pos in range(start, start + count):
        epoch, offset = divmod(pos, n)
        out.append(prompts[_epoch_order(n, seed, epoch)[offset]])
    return out


@functools.lru_cache(maxsize=4)  # an iteration spans at most two epochs unless count exceeds the dataset
def _epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(f"epoch:{seed}:{epoch}").shuffle(order)
    return tuple(order)


def max_context_of(model_dir: str | os.PathLike) -> int:
    """The checkpoint's max context (config.json max_position_embeddings)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or config.get("n_positions") or config["max_seq_len"])


__all__ = [
    "DatasetError",
    "PromptTooLongError",
    "Task",
    "TaskConfig",
    "TaskRecord",
    "chat_template_text",
    "encode_prompts",
    "draw_prompts",
    "iteration_prompts",
    "load_jsonl",
    "load_records",
    "load_task",
    "max_context_of",
    "parse_record",
    "render_chat",
    "resolve_loader",
    "running_sum_records",
]
