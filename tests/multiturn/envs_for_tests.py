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
