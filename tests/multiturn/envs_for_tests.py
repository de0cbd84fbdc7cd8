"""Environments for the multi-turn tests, importable by worker processes (`tests.multiturn.envs_for_tests:…`)."""

from __future__ import annotations

import time

from seer.tasks.env import Environment, Observation, StepResult, Turn


class EchoEnv(Environment):
    """Answers every turn with fixed observation ids; done after `turns` turns with reward = turns seen."""

    stop = ("</c>",)

    def __init__(self, prompt: str, reference: dict, turns: int = 3, obs: tuple[int, ...] = (61, 61, 10)) -> None:
        super().__init__(prompt, reference)
        self.turns, self.obs, self.seen = turns, tuple(obs), []

    async def reset(self):
        return Observation(token_ids=(62,))

    async def step(self, turn: Turn) -> StepResult:
        self.seen.append(turn.text)
        if len(self.seen) >= self.turns:
            return StepResult(done=True, reward=float(len(self.seen)))
        return StepResult(observation=Observation(token_ids=self.obs))


class HangingEnv(EchoEnv):
    """Blocks forever (a sleep the event loop cannot interrupt) in turn 1's step when the
    reference says so; otherwise an EchoEnv."""

    async def step(self, turn: Turn) -> StepResult:
        if self.reference.get("hang") and turn.index == 1:
            time.sleep(3600)
        return await super().step(turn)


class RaisingEnv(EchoEnv):
    """Raises in its second step."""

    async def step(self, turn: Turn) -> StepResult:
        if len(self.seen) == 1:
            self.seen.append("raised")
            raise RuntimeError("tool crashed")
        return await super().step(turn)


class ScriptEnv(Environment):
    """Answers each turn with `obs` ids; done after `turns` turns (its stop sequences come from env.stop)."""

    def __init__(self, prompt: str, reference: dict, obs: tuple[int, ...] = (10,), turns: int = 2,
                 hang_s: float = 0.0, raise_in_turn: int = 0) -> None:
        super().__init__(prompt, reference)
        self.obs, self.turns = tuple(obs), turns
        self.hang_s = hang_s if reference.get("hang") else 0.0
        self.raise_in_turn = raise_in_turn

    async def step(self, turn: Turn) -> StepResult:
        if turn.index == 1 and self.hang_s:
            time.sleep(self.hang_s)
        if turn.index == self.raise_in_turn:
            raise RuntimeError("tool crashed")
        if turn.index >= self.turns:
            return StepResult(done=True, reward=1.0)
        return StepResult(observation=Observation(token_ids=self.obs))


class LineEnv(Environment):
    """One line per turn; the observation echoes the line's own token ids back (exactly, never
    re-tokenized); done after three lines, rewarded 1 when the first is a running-sum step."""

    stop = ("\n",)

    def __init__(self, prompt: str, reference: dict) -> None:
        super().__init__(prompt, reference)
        self.lines: list[str] = []

    async def step(self, turn: Turn) -> StepResult:
        import re

        self.lines.append(turn.text)
        if len(self.lines) >= 3 or turn.reason == "eos":
            return StepResult(done=True, reward=float(re.fullmatch(r"-\d=\d+\n", self.lines[0]) is not None))
        return StepResult(observation=Observation(token_ids=turn.token_ids))


class UnrulyEnv(EchoEnv):
    """User code at its worst, by reference: a constructor that hangs or exits, a step that exits,
    interrupts or kills its process, an error_observation that hangs or raises."""

    def __init__(self, prompt: str, reference: dict, **kw) -> None:
        if reference.get("init") == "hang":
            time.sleep(3600)
        if reference.get("init") == "exit":
            raise SystemExit(0)
        super().__init__(prompt, reference, **kw)

    async def step(self, turn: Turn) -> StepResult:
        import os
        import sys

        how = self.reference.get("step")
        if how == "exit":
            sys.exit(0)
        if how == "interrupt":
            raise KeyboardInterrupt
        if how == "die":
            os._exit(1)
        if how == "raise":
            raise RuntimeError("tool crashed")
        return await super().step(turn)

    def error_observation(self, error: str):
        how = self.reference.get("error_observation")
        if how == "hang":
            time.sleep(3600)
        if how == "raise":
            raise RuntimeError("error_observation crashed")
        return f"[custom: {error}]"


class NoStepEnv(Environment):
    """Forgets to implement step: Environment.step is abstract, so task.env refuses it at load."""


class ContractEnv(Environment):
    """Breaks the environment contract in its first step as `reference["how"]` says (or keeps it,
    with NumPy's types); every trajectory is done with reward 1 in its second step."""

    stop = ("</c>",)

    async def step(self, turn: Turn) -> StepResult:
        import numpy as np

        how = self.reference.get("how")
        if turn.index > 1:
            return StepResult(done=True, reward=1.0)
        replies = {
            "huge_reward": lambda: StepResult(done=True, reward=10**400),
            "nan_reward": lambda: StepResult(done=True, reward=float("nan")),
            "bool_reward": lambda: StepResult(done=True, reward=True),
            "int_ids": lambda: StepResult(observation=Observation(token_ids=5)),
            "str_ids": lambda: StepResult(observation=Observation(token_ids="abc")),
            "big_id": lambda: StepResult(observation=Observation(token_ids=(61, 10**6))),
            "negative_id": lambda: StepResult(observation=Observation(token_ids=(-1,))),
            "text_not_str": lambda: StepResult(observation=Observation(text=7)),
            "np_f32_reward": lambda: StepResult(done=True, reward=np.float32(0.5)),
            "np_i64_reward": lambda: StepResult(done=True, reward=np.int64(2)),
            "np_ids": lambda: StepResult(observation=Observation(token_ids=np.array([61, 61], dtype=np.int64))),
        }
        return replies[how]() if how in replies else StepResult(observation="ok")
