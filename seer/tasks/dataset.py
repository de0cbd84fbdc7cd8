"""Task datasets: the built-in running-sum family or a user's JSONL file, and prompt encoding.

A task is prompts plus the reward function that scores them; the reward is named by a
`module:function` string (so it can travel to a worker process and into a run's config).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from seer.types import PromptSpec
from seer.tasks.reward import RewardFn, resolve_reward_fn
from seer.tasks.running_sum import RunningSumConfig, generate_problems

BUILTIN_TASKS = ("running_sum",)
RUNNING_SUM_REWARD = "seer.tasks.running_sum:score"


class DatasetError(ValueError):
    """A dataset that cannot be loaded; the message names the file and line."""


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
    """One prompt before tokenization."""

    index: int
    text: str
    reference: dict


@dataclass(frozen=True)
class TaskConfig:
    """What the run config says about the task. `dataset` set means a user JSONL task."""

    name: str = "running_sum"
    dataset: str | None = None  # path of a JSONL file; then `reward` is required
    reward: str | None = None  # "module:function"; defaults to the built-in task's reward
    prompt_field: str = "prompt"
    num_prompts: int = 256  # built-in task only
    seed: int = 0  # built-in task only
    median_steps: float = 18.0  # built-in task only: median reasoning steps per prompt
    sigma: float = 1.1  # built-in task only: lognormal spread of the step count


@dataclass(frozen=True)
class Task:
    name: str
    records: list[TaskRecord]
    reward_spec: str  # "module:function"
    reward_fn: RewardFn


def load_task(cfg: TaskConfig) -> Task:
    """The task a run config describes, with its reward function already resolved (fails early)."""
    if cfg.dataset is not None:
        if not cfg.reward:
            raise DatasetError(f"dataset {cfg.dataset} needs a reward function: set task.reward to 'module:function'")
        records = load_jsonl(cfg.dataset, prompt_field=cfg.prompt_field)
        return Task(Path(cfg.dataset).stem, records, cfg.reward, resolve_reward_fn(cfg.reward))
    if cfg.name not in BUILTIN_TASKS:
        raise DatasetError(f"unknown built-in task {cfg.name!r}; known: {', '.join(BUILTIN_TASKS)} (or set task.dataset)")
    records = running_sum_records(
        RunningSumConfig(num_prompts=cfg.num_prompts, seed=cfg.seed, median_steps=cfg.median_steps, sigma=cfg.sigma)
    )
    reward = cfg.reward or RUNNING_SUM_REWARD
    return Task(cfg.name, records, reward, resolve_reward_fn(reward))


def running_sum_records(cfg: RunningSumConfig) -> list[TaskRecord]:
    return [TaskRecord(i, p.text, p.reference) for i, p in enumerate(generate_problems(cfg))]


def load_jsonl(path: str | os.PathLike, *, prompt_field: str = "prompt") -> list[TaskRecord]:
    """One JSON object per non-blank line; `prompt_field` is the prompt, every other key the reference."""
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
            if not isinstance(obj, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            if prompt_field not in obj:
                raise DatasetError(f"{where}: missing the prompt field {prompt_field!r}")
            text = obj.pop(prompt_field)
            if not isinstance(text, str) or not text:
                raise DatasetError(f"{where}: the prompt field {prompt_field!r} must be a non-empty string")
            records.append(TaskRecord(len(records), text, obj))
    if not records:
        raise DatasetError(f"{path}: the dataset has no prompts")
    return records


def encode_prompts(records: list[TaskRecord], tokenizer, max_context: int, *, min_new_tokens: int = 1) -> list[PromptSpec]:
    """Tokenize with the model's own tokenizer (its default special tokens, no chat template).

    Rejects, naming the index, any prompt that leaves fewer than `min_new_tokens` positions of
    `max_context`: better at load time than as a failed request mid-iteration.
    """
    specs = []
    for r in records:
        ids = list(tokenizer(r.text)["input_ids"])
        if len(ids) + min_new_tokens > max_context:
            raise PromptTooLongError(r.index, len(ids), max_context)
        specs.append(PromptSpec(index=r.index, text=r.text, prompt_ids=ids, reference=r.reference))
    return specs


def iteration_prompts(prompts: list[PromptSpec], iteration: int, count: int, *, seed: int = 0) -> list[PromptSpec]:
    """The `count` prompts of `iteration`: epochs over a seeded shuffle, so a resumed run gets the same ones."""
    if not prompts:
        raise ValueError("no prompts")
    out: list[PromptSpec] = []
    start = iteration * count
    for pos in range(start, start + count):
        epoch, offset = divmod(pos, len(prompts))
        order = list(range(len(prompts)))
        random.Random(f"epoch:{seed}:{epoch}").shuffle(order)
        out.append(prompts[order[offset]])
    return out


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
    "encode_prompts",
    "iteration_prompts",
    "load_jsonl",
    "load_task",
    "max_context_of",
    "running_sum_records",
]
