"""Scripted multi-turn trajectories: each turn's length, each observation and each tool latency, fixed.

A multi-turn workload, for the simulator (`seer.sim.multiturn`) and for real runs that replay it
(bench.multiturn_compare, through bench.harness.replay): every configuration runs the same
trajectories, so they differ by scheduling only. A `Script` is one trajectory: the model's tokens
per turn and, between turns, the environment's observation tokens and how long its tool took;
`script_from_sample` takes one from a finished multi-turn sample.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from seer.rollout.stats import union_length
from seer.sim.workloads import LengthKey
from seer.types import Sample


@dataclass(frozen=True)
class Script:
    """One trajectory. `obs[k]` and `latency_s[k]` come before turn k+1 (`obs[0]`: the reset's,
    usually empty); the trajectory ends after its last turn, `turns[-1]`."""

    turns: tuple[int, ...]  # model tokens of each turn
    obs: tuple[tuple[int, ...], ...]  # len(turns) observations, the first before turn 1
    latency_s: tuple[float, ...]  # the tool's latency before each observation

    def __post_init__(self) -> None:
        if not (len(self.obs) == len(self.latency_s) == len(self.turns)):
            raise ValueError(f"{len(self.turns)} turns need as many observations and latencies, got "
                             f"{len(self.obs)} and {len(self.latency_s)}")

    @property
    def model_tokens(self) -> int:
        return sum(self.turns)

    @property
    def response_tokens(self) -> int:
        """Everything after the prompt: turns and observations (what the oracle is told)."""
        return sum(self.turns) + sum(map(len, self.obs))

    def turn_left(self, position: int) -> int:
        """Tokens left in the turn that `position` (tokens after the prompt, observations included)
        falls in; 0 at a turn's end or past the last."""
        pos = 0
        for o, n in zip(self.obs, self.turns):
            pos += len(o)
            if position < pos + n:
                return pos + n - max(position, pos)
            pos += n
        return 0

    def rebase(self, position: int) -> Script:
        """What is left of it `position` tokens in (an APRIL carry-over: the next iteration's prompt
        holds those tokens). Mid-turn: the rest of that turn; at a turn's end: the pending
        observation (its tool runs again) and the turns after it."""
        pos = 0
        for k, (o, n) in enumerate(zip(self.obs, self.turns)):
            if position == pos:  # before obs[k]: it has not been appended
                return Script(self.turns[k:], self.obs[k:], self.latency_s[k:])
            pos += len(o)
            if position < pos + n:
                return Script((pos + n - position, *self.turns[k + 1:]), ((), *self.obs[k + 1:]),
                              (0.0, *self.latency_s[k + 1:]))
            pos += n
        return Script((), (), ())


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, bool]]:
    """A loss mask's runs, (start, end, model tokens?) in order: the turns and the observations."""
    out = []
    i = 0
    while i < len(mask):
        j = i
        while j < len(mask) and mask[j] == mask[i]:
            j += 1
        out.append((i, j, bool(mask[i])))
        i = j
    return out


def script_from_sample(sample: Sample, latencies: Sequence[float]) -> Script:
    """A finished multi-turn sample's turns and observations (from its loss mask), with `latencies`
    (one per observation after a turn) for its tool calls."""
    mask = sample.loss_mask or [1] * len(sample.response_ids)
    turns: list[int] = []
    obs: list[tuple[int, ...]] = [()]
    for i, j, model in mask_runs(mask):
        if model:
            turns.append(j - i)
        elif not turns:
            obs[0] = tuple(sample.response_ids[i:j])
        else:
            obs.append(tuple(sample.response_ids[i:j]))
    if not turns:  # an empty response: one empty turn keeps the shape
        turns = [0]
    obs = obs[:len(turns)] + [()] * (len(turns) - len(obs))
    lat = [0.0, *list(latencies)[:len(turns) - 1]]
    return Script(tuple(turns), tuple(obs), tuple(lat + [0.0] * (len(turns) - len(lat))))


def tool_latencies(key: str, n: int, median_s: float, sigma: float) -> list[float]:
    """`n` lognormal tool latencies, deterministic in `key` (the same in every configuration)."""
    rng = random.Random(f"tool-latency:{key}")
    return [rng.lognormvariate(math.log(median_s), sigma) if median_s > 0 else 0.0 for _ in range(n)]


# ---- accounting shared by the real comparison and the simulator -------------------------------

def idle_while_tools(chunks, waits, names: Sequence[str], start: float, end: float) -> dict[str, float]:
    """Per instance: seconds with none of our chunks running there while some tool call was running
    (the union of tool waits and that instance's chunks, less the union of its chunks)."""
    tools = [(w.dispatch_time, w.complete_time) for w in waits]
    out = {}
    for n in names:
        busy = [(c.dispatch_time, c.complete_time) for c in chunks if c.instance == n]
        out[n] = union_length(tools + busy, start, end) - union_length(busy, start, end)
    return out


def continuation_prefix(chunks) -> dict:
    """The first chunk of every turn after the first: its history (prompt tokens) and how much of it
    the instance found cached (local prefix cache or the pool) vs recomputed."""
    first: dict[tuple[str, int], object] = {}
    for c in chunks:
        if c.turn >= 1 and c.finish_reason != "error":
            k = (c.request_id, c.turn)
            if k not in first or c.chunk_index < first[k].chunk_index:
                first[k] = c
    cs = list(first.values())
    return {"turns": len(cs), "history_tokens": sum(c.prompt_tokens for c in cs),
            "cached_tokens": sum(c.cached_prefix_tokens for c in cs),
            "recomputed_tokens": sum(c.prompt_tokens - c.cached_prefix_tokens for c in cs),
            "moved_turns": sum(1 for c in cs if c.migrated)}


def true_lengths(scripts: Mapping[LengthKey, Script]) -> dict[LengthKey, int]:
    """The oracle's table: each trajectory's whole response (turns and observations)."""
    return {k: s.response_tokens for k, s in scripts.items()}
