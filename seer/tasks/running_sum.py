"""The built-in task: count a total down to zero, taking away 1-9 per step, one line per step.

Why this task: it is shaped like a reasoning rollout at a size two CPU cores can serve.
- The number of steps a prompt needs is drawn from a lognormal, so response lengths are
  heavy-tailed across prompts, and strongly correlated within a group (every sample of a
  prompt must cover the same total).
- Each step takes away a digit of the writer's choosing, so the responses of one group share
  their format and number range without being identical: what grouped speculative decoding
  drafts from.
- Numbers are zero-padded to a fixed width and the prompt ends the way every line ends
  ("=0373"), so each step depends only on the line above it, at fixed offsets. A small model
  learns that from a short warm start, and still slips on borrows (partial reward).
- A response is steps only. The default model's warm-start demonstrations restate the start
  line first half of the time (`WarmStartSpec.restate_fraction`), which scores 0: a habit GRPO
  unlearns within a few iterations, so a short run shows the reward rising.

Trace format (prompt, then one line per step; the response ends with EOS after "=0000")::

    Take away 1-9 at a time until nothing is left.
    start=0023
    -8=0015
    -9=0006
    -6=0000
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

PROMPT_TEMPLATE = "Take away 1-9 at a time until nothing is left.\nstart={total}\n"
MEAN_DIGIT = 5.0  # mean of uniform 1..9: what one step takes away, on average
TRACE_FORMAT_VERSION = 3  # bump when the prompt or trace format changes

_STEP = re.compile(r"-(\d+)=(\d+)")


@dataclass(frozen=True)
class RunningSumConfig:
    """Dataset shape. Defaults give median ~150 tokens, p99/p50 ~10, max < 2048 tokens."""

    num_prompts: int = 256
    seed: int = 0
    median_steps: float = 18.0
    sigma: float = 1.1  # lognormal sigma of the step count: p99/p50 ~ exp(2.33 sigma)
    min_steps: int = 2
    max_steps: int = 215

    @property
    def width(self) -> int:
        """Digits of every number in the dataset: enough for the largest total."""
        return len(str(round(self.max_steps * MEAN_DIGIT) + 4))


@dataclass(frozen=True)
class Problem:
    """One prompt of the task and what its reward needs."""

    text: str
    reference: dict  # {"total": int, "steps": int, "width": int}


def lognormal_count(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    """A heavy-tailed count: round(lognormal(log median, sigma)), clipped to [lo, hi] (one draw)."""
    return min(max(round(math.exp(rng.gauss(math.log(median), sigma))), lo), hi)


def generate_problems(cfg: RunningSumConfig) -> list[Problem]:
    """Deterministic in cfg: the same config always yields the same problems."""
    rng = random.Random(f"running_sum:{cfg.seed}")
    problems = []
    for _ in range(cfg.num_prompts):
        steps = lognormal_count(rng, cfg.median_steps, cfg.sigma, cfg.min_steps, cfg.max_steps)
        total = round(steps * MEAN_DIGIT) + rng.randint(0, 4)
        problems.append(
            Problem(
                text=PROMPT_TEMPLATE.format(total=f"{total:0{cfg.width}d}"),
                reference={"total": total, "steps": steps, "width": cfg.width},
            )
        )
    return problems


def solve(reference: dict, rng: random.Random) -> str:
    """A correct trace (the response text, without EOS). Different rng, different path."""
    left, w = reference["total"], reference["width"]
    lines = []
    while left > 0:
        d = rng.randint(1, min(9, left))
        left -= d
        lines.append(f"-{d}={left:0{w}d}")
    return "\n".join(lines) + "\n"


def restated_start_line(reference: dict) -> str:
    """The noisy demonstrations' habit (see WarmStartSpec.restate_fraction): repeating the
    prompt's last line before the first step. `score` gives such a response 0."""
    return f"start={reference['total']:0{reference['width']}d}\n"


def score(response_text: str, reference: dict) -> float:
    """1.0 for a correct trace that reaches zero and stops; else half the share of the total
    correctly taken away before the first slip.

    The partial credit gives GRPO a gradient on long prompts where a small model rarely gets
    every step right; a flawed trace can never score above 0.5.
    """
    total = int(reference["total"])
    left = total
    lines = response_text.strip().split("\n")
    for i, line in enumerate(lines):
        m = _STEP.fullmatch(line.strip())
        if m is None or left == 0:
            break  # not a step, or something after reaching zero
        d, v = int(m.group(1)), int(m.group(2))
        if not 1 <= d <= 9 or v != left - d or v < 0:
            break
        left = v
        if left == 0 and i == len(lines) - 1:
            return 1.0
    return 0.5 * (total - left) / max(total, 1)
