"""The built-in task: a running sum written out step by step until it reaches a target.

Why this task: it is shaped like a reasoning rollout at a size two CPU cores can serve.
- The number of steps a prompt needs is drawn from a lognormal, so response lengths are
  heavy-tailed across prompts, and strongly correlated within a group (every sample of a
  prompt must cover the same distance).
- Each step adds a digit of the writer's choosing (1-9), so the responses of one group share
  their format, target and number range without being identical: what grouped speculative
  decoding drafts from.
- Every line restates the target and numbers are zero-padded to a fixed width, so each step
  depends only on the line above it at fixed offsets; a small model learns it from a short
  warm start, and still slips on arithmetic (partial reward).

Trace format (one line per step, then the answer)::

    Start at 037, add digits 1-9 until the total reaches 060.
    037+8=045<060
    045+9=054<060
    054+7=061>=060
    answer 061
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

PROMPT_TEMPLATE = "Start at {start}, add digits 1-9 until the total reaches {target}.\n"
MEAN_DIGIT = 5.0  # mean of uniform 1..9: the distance per step a solution covers
TRACE_FORMAT_VERSION = 2  # bump when the prompt or trace format changes

_STEP = re.compile(r"(\d+)\+(\d+)=(\d+)(<|>=)(\d+)")
_ANSWER = re.compile(r"answer (\d+)")


@dataclass(frozen=True)
class RunningSumConfig:
    """Dataset shape. Defaults give median ~140 tokens, p99/p50 ~10, max < 2048 tokens."""

    num_prompts: int = 256
    seed: int = 0
    median_steps: float = 9.0
    sigma: float = 1.1  # lognormal sigma of the step count: p99/p50 ~ exp(2.33 sigma)
    min_steps: int = 2
    max_steps: int = 120
    min_start: int = 10
    max_start: int = 99

    @property
    def width(self) -> int:
        """Digits of every number in the dataset: enough for the largest total a trace can reach."""
        return len(str(self.max_start + round(self.max_steps * MEAN_DIGIT) + 4 + 9))


@dataclass(frozen=True)
class Problem:
    """One prompt of the task and what its reward needs."""

    text: str
    reference: dict  # {"start": int, "target": int, "steps": int, "width": int}


def generate_problems(cfg: RunningSumConfig) -> list[Problem]:
    """Deterministic in cfg: the same config always yields the same problems."""
    rng = random.Random(f"running_sum:{cfg.seed}")
    mu = math.log(cfg.median_steps)
    problems = []
    for _ in range(cfg.num_prompts):
        steps = round(math.exp(rng.gauss(mu, cfg.sigma)))
        steps = min(max(steps, cfg.min_steps), cfg.max_steps)
        start = rng.randint(cfg.min_start, cfg.max_start)
        target = start + round(steps * MEAN_DIGIT) + rng.randint(0, 4)
        w = cfg.width
        problems.append(
            Problem(
                text=PROMPT_TEMPLATE.format(start=f"{start:0{w}d}", target=f"{target:0{w}d}"),
                reference={"start": start, "target": target, "steps": steps, "width": w},
            )
        )
    return problems


def solve(reference: dict, rng: random.Random) -> str:
    """A correct trace (the response text, without EOS). Different rng, different path."""
    start, target, w = reference["start"], reference["target"], reference["width"]
    lines, x = [], start
    while True:
        d = rng.randint(1, 9)
        y = x + d
        cmp = "<" if y < target else ">="
        lines.append(f"{x:0{w}d}+{d}={y:0{w}d}{cmp}{target:0{w}d}")
        if y >= target:
            break
        x = y
    lines.append(f"answer {y:0{w}d}")
    return "\n".join(lines)


def score(response_text: str, reference: dict) -> float:
    """1.0 for a fully correct trace; otherwise half the fraction of distance correctly covered.

    The partial credit gives GRPO a gradient on long prompts where a small model rarely gets
    every step right; a wrong trace can never score above 0.5.
    """
    start, target = int(reference["start"]), int(reference["target"])
    lines = response_text.strip().split("\n")
    x, reached = start, start
    finished = False
    for i, line in enumerate(lines):
        m = _STEP.fullmatch(line.strip())
        if m is None:
            if finished:
                a = _ANSWER.fullmatch(line.strip())
                if a is not None and int(a.group(1)) == x and i == len(lines) - 1:
                    return 1.0
            break
        if finished:
            break  # a step after the target was reached
        a_, d, y, cmp, t = (int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4), int(m.group(5)))
        if a_ != x or not 1 <= d <= 9 or y != x + d or t != target or (cmp == "<") != (y < target):
            break
        x = reached = y
        finished = y >= target
    progress = (reached - start) / max(target - start, 1)
    return 0.5 * min(max(progress, 0.0), 1.0)
