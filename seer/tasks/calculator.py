"""The built-in multi-turn task: count a total down to zero, one calculator call per step.

The model takes away 1-9 per turn, but it never writes the result: it calls the calculator with
the current value and the digit, and the environment answers with the difference. The next call
must start from the value the calculator returned, so the reward depends on using what the
environment says (the model cannot succeed without copying each observation forward).

- The number of turns a prompt needs is lognormal, so trajectories are heavy-tailed in turns and
  tokens, and correlated within a group (every sample of a prompt must cover the same total).
- Tool latency is lognormal too (`latency_median_s`, `latency_sigma`: tens to hundreds of ms by
  default), a blocking sleep in the step, as a subprocess or HTTP tool would block.
- The preset's warm-start demonstrations restate the start line before the first call half the
  time, which scores 0: a habit GRPO unlearns within a few iterations.

Trace format (prompt, then turns; the environment's tokens are the `=NNNN` lines; EOS at the end)::

    Count down with the calculator.
    start=0023
    <calc>0023-8</calc>=0015
    <calc>0015-9</calc>=0006
    <calc>0006-6</calc>=0000
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass

from seer.tasks.env import Environment, StepResult, Turn
from seer.tasks.running_sum import MEAN_DIGIT, Problem, RunningSumConfig, lognormal_count

PROMPT_TEMPLATE = "Count down with the calculator.\nstart={total}\n"
CALL_END = "</calc>"
TRACE_FORMAT_VERSION = 1  # bump when the prompt, call or observation format changes
_CALL = re.compile(r"<calc>(\d+)-(\d+)</calc>")


@dataclass(frozen=True)
class CalcTaskConfig:
    """Dataset shape: turns per prompt ~ lognormal(median_turns, sigma), clipped."""

    num_prompts: int = RunningSumConfig.num_prompts
    seed: int = 0
    median_turns: float = 4.0
    sigma: float = 0.7
    min_turns: int = 1
    max_turns: int = 14
    width: int = 4  # digits of every number
    format_version: int = TRACE_FORMAT_VERSION


def generate_problems(cfg: CalcTaskConfig) -> list[Problem]:
    """Deterministic in cfg."""
    rng = random.Random(f"calculator:{cfg.seed}")
    out = []
    for _ in range(cfg.num_prompts):
        turns = lognormal_count(rng, cfg.median_turns, cfg.sigma, cfg.min_turns, cfg.max_turns)
        total = max(1, round(turns * MEAN_DIGIT) + rng.randint(-2, 2))
        out.append(Problem(PROMPT_TEMPLATE.format(total=f"{total:0{cfg.width}d}"),
                           {"total": total, "steps": turns, "width": cfg.width}))
    return out


def call_text(left: int, digit: int, width: int) -> str:
    return f"<calc>{left:0{width}d}-{digit}{CALL_END}"


def observation_text(value: int, width: int) -> str:
    return f"={value:0{width}d}\n"


def solve(reference: dict, rng: random.Random) -> list[tuple[str, str]]:
    """A correct trajectory as (turn text, observation text) pairs; the last turn is "" (then EOS)."""
    left, w = reference["total"], reference["width"]
    out = []
    while left > 0:
        d = rng.randint(1, min(9, left))
        out.append((call_text(left, d, w), observation_text(left - d, w)))
        left -= d
    out.append(("", ""))
    return out


def restated_start_line(reference: dict) -> str:
    return f"start={reference['total']:0{reference['width']}d}\n"


@dataclass
class Countdown:
    """The calculator's rules on one trajectory, whoever drives it: `CalculatorEnv` (model turns as
    text) or an agent behind the gateway (tool calls, seer.tasks.agents), so both score alike.

    Reward 1.0 for a trajectory that reaches zero through correct calls (each starting from the
    last answer, D in 1..9, never below zero) and then ends; otherwise half the share of the total
    taken away before the first slip. A slip ends the trajectory at once.
    """

    total: int
    width: int
    left: int = -1  # what is left to count down (the last answer)

    def __post_init__(self) -> None:
        if self.left < 0:
            self.left = self.total

    @classmethod
    def of(cls, reference: dict) -> "Countdown":
        return cls(int(reference["total"]), int(reference["width"]))

    def partial(self) -> float:
        """The reward of a trajectory that ends here without finishing."""
        return 0.5 * (self.total - self.left) / max(self.total, 1)

    def end(self, text: str, ended_with_eos: bool) -> float:
        """The reward of a turn that calls nothing: 1.0 for EOS with nothing said once at zero."""
        return 1.0 if ended_with_eos and text.strip() == "" and self.left == 0 else self.partial()

    def parse(self, text: str) -> tuple[int, int] | None:
        """(A, D) of a turn that is one call `<calc>A-D</calc>` and nothing else while there is
        something left; None otherwise (the trajectory ends)."""
        m = _CALL.fullmatch(text.strip())
        if m is None or self.left == 0:
            return None
        return int(m.group(1)), int(m.group(2))

    def take(self, a: int, d: int) -> int | None:
        """Apply a parsed call: the new value, or None for a slip (not from the last answer, D outside
        1-9, below zero)."""
        if a != self.left or not 1 <= d <= 9 or a - d < 0:
            return None
        self.left = a - d
        return self.left


def tool_latency_s(median_s: float, sigma: float, reference: dict | None = None, call: int = 0) -> float:
    """Calculator call `call`'s latency (0 for the first): lognormal (0 when the median is 0), or the
    one recorded for it when the reference holds `latencies` (a benchmark's replay, one per call)."""
    recorded = (reference or {}).get("latencies")
    if recorded is not None:
        return float(recorded[call]) if call < len(recorded) else 0.0
    return random.lognormvariate(math.log(median_s), sigma) if median_s > 0 else 0.0


class CalculatorEnv(Environment):
    """The calculator: answers `<calc>A-D</calc>` with `=A-D`; scores when the model stops (`Countdown`)."""

    stop = (CALL_END,)

    def __init__(self, prompt: str, reference: dict, latency_median_s: float = 0.08, latency_sigma: float = 0.7,
                 fail_every: int = 0) -> None:
        super().__init__(prompt, reference)
        self.count = Countdown.of(reference)
        self.latency_median_s = latency_median_s
        self.latency_sigma = latency_sigma
        self.fail_every = fail_every  # tests: every n-th call raises (0: never)
        self.calls = 0

    @property
    def left(self) -> int:
        return self.count.left

    def _wait(self) -> None:
        time.sleep(tool_latency_s(self.latency_median_s, self.latency_sigma, self.reference, self.calls))

    async def step(self, turn: Turn) -> StepResult:
        if turn.reason == "eos" and turn.text.strip() == "":
            return StepResult(done=True, reward=self.count.end(turn.text, ended_with_eos=True))
        call = self.count.parse(turn.text) if turn.reason == "stop_sequence" else None
        if call is None:
            return StepResult(done=True, reward=self.count.partial())  # not a call, or a call after zero
        self._wait()
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            raise RuntimeError("calculator unavailable")
        left = self.count.take(*call)
        if left is None:
            return StepResult(done=True, reward=self.count.partial())
        return StepResult(observation=observation_text(left, self.count.width))


def score(response_text: str, reference: dict) -> float:
    """The environment's reward, recomputed from a whole trajectory's text (calls and answers)."""
    total, w = int(reference["total"]), int(reference["width"])
    left = total
    rest = response_text
    while rest:
        m = re.match(r"<calc>(\d+)-(\d+)</calc>=(\d+)\n", rest)
        if m is None:
            break
        a, d, v = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if left == 0 or a != left or not 1 <= d <= 9 or a - d < 0 or v != a - d:
            break
        left, rest = v, rest[m.end():]
    if left == 0 and rest.strip() == "":
        return 1.0
    return 0.5 * (total - left) / max(total, 1)
