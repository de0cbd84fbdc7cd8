"""Verifiable tasks and their rewards: the built-in running-sum family and user JSONL tasks."""

from seer.tasks.dataset import (
    DatasetError,
    PromptTooLongError,
    Task,
    TaskConfig,
    TaskRecord,
    draw_prompts,
    encode_prompts,
    iteration_prompts,
    load_jsonl,
    load_task,
    max_context_of,
)
from seer.tasks.reward import (
    RewardAborted,
    RewardFn,
    RewardRunner,
    RewardSpecError,
    RewardStats,
    call_reward,
    resolve_reward_fn,
)

__all__ = [
    "DatasetError",
    "PromptTooLongError",
    "RewardAborted",
    "RewardFn",
    "RewardRunner",
    "RewardSpecError",
    "RewardStats",
    "Task",
    "TaskConfig",
    "TaskRecord",
    "call_reward",
    "draw_prompts",
    "encode_prompts",
    "iteration_prompts",
    "load_jsonl",
    "load_task",
    "max_context_of",
    "resolve_reward_fn",
]
