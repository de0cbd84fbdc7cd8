"""The calculator task as an `Environment` and as a gateway agent, in one run: `python -m bench.agent_gateway`

SKELETON (issue 30, item 6): the parts that need no gateway are here and tested
(tests/bench/test_agent_gateway_parts.py); `run_gateway_iteration` is completed once the gateway
(seer/rollout/gateway/) is on the same branch, and nothing is recorded before then.

    python -m bench.agent_gateway                              # the comparison docs/agents.md will quote
    python -m bench.agent_gateway --iterations 1 --repeats 1 --groups 4   # a quick look

What it measures, on real instances over the KV pool with context-aware scheduling:
- env: the built-in calculator task on multi-turn rollout (seer.rollout.multi_turn), its
  `CalculatorEnv` in the environment workers (process mode);
- gateway: the same task through the OpenAI-compatible gateway, played by the ordinary
  `openai`-client agent (seer.tasks.agents.calculator_openai's loop, `--agent-mode` process or loop);
- gateway_sticky: the gateway with session-sticky scheduling (seer.scheduler.policies.sticky), as
  the peers pin a session to one engine.

Replay makes the configurations differ by their machinery only. An untimed warm-up runs the model on
the real environment once and records every trajectory's model tokens per turn (`TokenScript`). In
every timed run the instances generate each turn's recorded length with the real model
(`TokenReplayBackend`: EOS and stop strings off), and the turn's tokens are then the recorded ones,
so the environment and the agent see the warm-up's text and answer alike; the tool waits the
latency recorded for the trajectory's group and call (the reference's `latencies`, which the
calculator's environment and its agents' tool both wait instead of a fresh draw:
seer.tasks.calculator.tool_latency_s). Configurations alternate (forward, then backward)
across repeats. Reported per configuration: model tokens/s, the iteration's wall time, and for the
gateway its cost per call; the env and gateway runs are checked to hold the same tokens, sample for
sample (`same_tokens`).

Writes <out>/agent_gateway.json and agent_gateway.md (default out: bench/results/agent_gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from seer import request_ids
from seer.sim.scripts import mask_runs
from seer.types import GenerateRequest, GenerateResult, InstanceBackend

from bench.harness.trace_backend import TraceBackend

OUT = Path("bench/results/agent_gateway")
CONFIGS = ("env", "gateway", "gateway_sticky")
AGENT = "seer.tasks.agents.calculator_openai:agent"  # the agent of the gateway configurations


@dataclass(frozen=True)
class GWSettings:
    model: str = "calc"  # the calculator task's own embedded model
    groups: int = 16  # prompts per iteration
    group_size: int = 8  # sessions (trajectories) per prompt
    iterations: int = 3  # rollout iterations per configuration and repeat
    repeats: int = 2  # runs of every configuration, alternating order
    max_tokens: int = 640  # a trajectory's budget
    chunk_size: int = 64  # tokens per chunk
    instances: int = 2  # vLLM instances, one CPU core each
    latency_median_s: float = 0.08  # the calculator's tool latency (lognormal), recorded per group and turn
    latency_sigma: float = 0.7  # the tool latency's lognormal sigma
    agent_mode: str = "process"  # agent.mode of the gateway configurations
    configs: str = ",".join(CONFIGS)  # comma-separated, of env, gateway, gateway_sticky
    seed: int = 0  # seeds the prompts, the warm-up's sampling and the tool latencies
    out: str = str(OUT)  # where the json and md go

    def __post_init__(self) -> None:
        unknown = [c for c in self.configs.split(",") if c not in CONFIGS]
        if unknown:
            raise ValueError(f"unknown configurations {unknown}; known: {list(CONFIGS)}")
        if self.agent_mode not in ("process", "loop"):
            raise ValueError(f"agent_mode must be process or loop, got {self.agent_mode!r}")


def order(configs: Sequence[str], repeat: int) -> list[str]:
    """The configurations of one repeat: forward on even repeats, backward on odd ones."""
    return list(configs) if repeat % 2 == 0 else list(configs)[::-1]


# ---- replay: the warm-up's tokens and latencies -------------------------------------------------

@dataclass(frozen=True)
class TokenScript:
    """One trajectory's model tokens per turn and the observations between them (from its loss mask)."""

    turns: tuple[tuple[int, ...], ...]
    obs: tuple[tuple[int, ...], ...]  # len(turns); obs[0] before the first turn (usually empty)

    @classmethod
    def of(cls, response_ids: Sequence[int], loss_mask: Sequence[int] | None) -> "TokenScript":
        mask = loss_mask or [1] * len(response_ids)
        turns: list[tuple[int, ...]] = []
        obs: list[tuple[int, ...]] = [()]
        for i, j, model in mask_runs(mask):
            if model:
                turns.append(tuple(response_ids[i:j]))
            elif not turns:
                obs[0] = tuple(response_ids[i:j])
            else:
                obs.append(tuple(response_ids[i:j]))
        obs = obs[:len(turns)] + [()] * (len(turns) - len(obs))
        return cls(tuple(turns), tuple(obs))

    def tokens_at(self, position: int, count: int) -> tuple[int, ...]:
        """The recorded model tokens from `position` (tokens after the prompt, observations included)
        on, `count` of them, within the turn `position` falls in."""
        pos = 0
        for o, t in zip(self.obs, self.turns):
            pos += len(o)
            if position < pos:  # in an observation: no model token here
                return ()
            if position < pos + len(t):
                start = position - pos
                return t[start:start + count]
            pos += len(t)
        return ()

    def turn_left(self, position: int) -> int:
        return len(self.tokens_at(position, 1 << 30))


class TokenReplayBackend(TraceBackend):
    """An InstanceBackend over a real instance: each chunk generates what is left of its recorded
    turn (EOS and stop strings off, real cost), and returns the recorded tokens in place of the
    sampled ones, so whatever reads the turn's text sees the warm-up's."""

    def __init__(self, inner: InstanceBackend, scripts: dict[tuple[int, int], TokenScript], prompt_lens: dict[int, int]):
        super().__init__(inner, {}, {})
        self.scripts, self.prompt_lens = scripts, prompt_lens

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        sid = request_ids.parse(req.request_id)
        if sid is None:
            raise ValueError(f"replay needs scheduler request ids, got {req.request_id!r}")
        script = self.scripts[(sid.group_index, sid.sample)]
        position = len(req.prompt_ids) - self.prompt_lens[sid.group_index]
        left = script.turn_left(position)
        out = await self.capped(req, left, stop=())
        recorded = script.tokens_at(position, len(out.token_ids))
        return replace(out, token_ids=list(recorded) + list(out.token_ids[len(recorded):]))


def same_tokens(a: Sequence, b: Sequence) -> dict:
    """Two runs' samples by (group, sample): how many hold the same prompt and response tokens and mask."""
    key = lambda s: (s.group_id, s.sample_index)  # noqa: E731
    ib, same, differ = {key(s): s for s in b}, 0, []
    for s in a:
        t = ib.get(key(s))
        if t is not None and list(s.prompt.prompt_ids) == list(t.prompt.prompt_ids) \
                and list(s.response_ids) == list(t.response_ids) and (s.loss_mask or []) == (t.loss_mask or []):
            same += 1
        else:
            differ.append(key(s))
    return {"samples": len(a), "same": same, "differ": differ[:10]}


# ---- the runs -----------------------------------------------------------------------------------

async def run_env_iteration(ctx, prompts, s: GWSettings, iteration: int):
    """One iteration of the env configuration: multi-turn rollout with the calculator environment
    over `TokenReplayBackend`s (ctx: a RolloutContext whose backends and env runner the caller built;
    the prompts' references hold the recorded `latencies`)."""
    from seer.rollout.base import RolloutRequest
    from seer.rollout.multi_turn import multi_turn_rollout
    from seer.types import SamplingParams

    return await multi_turn_rollout(ctx, RolloutRequest(iteration, prompts, s.group_size, SamplingParams(
        temperature=1.0, max_tokens=s.max_tokens, seed=s.seed)))


async def run_gateway_iteration(ctx, prompts, s: GWSettings, iteration: int, policy: str):
    """One iteration through the gateway. TO COMPLETE after the merge with the gateway branch:
    1. ctx as for env, plus ctx.gateway (seer.rollout.gateway.Gateway over the model's EmbeddedChat,
       served by GatewayServer on 127.0.0.1) and ctx.agents = AgentRunner(AgentSpec.parse(
       AGENT, 600, args={"latency_median_s": 0.0}, cfg=AgentConfig(mode=s.agent_mode)),
       max_concurrent=s.groups * s.group_size), and the scheduler's policy `policy` (context, or
       session-sticky: bench.multiturn_compare's STICKY);
    2. seer.rollout.gateway:gateway_rollout(ctx, RolloutRequest(...)) as run_env_iteration does;
    3. the gateway's cost per call: the server's handling time per call (parse, render, tokenize,
       reply), from its own counters if it keeps them, else timed around its handler here."""
    raise NotImplementedError("bench.agent_gateway's gateway configurations need seer.rollout.gateway "
                              "(issue 30's gateway branch); see run_gateway_iteration's docstring")


def summarize(runs: Sequence[dict]) -> dict:
    """Per configuration: model tokens/s over all its iterations' wall time, and ratios to env."""
    rows: dict[str, dict] = {}
    for name in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == name]
        tokens, wall = sum(r["model_tokens"] for r in mine), sum(r["wall_s"] for r in mine)
        rows[name] = {"iterations": len(mine), "model_tokens": tokens, "wall_s": round(wall, 3),
                      "model_tokens_per_s": round(tokens / wall, 1) if wall else None,
                      "wall_s_median": round(statistics.median(r["wall_s"] for r in mine), 3)}
    base = rows.get("env", {}).get("model_tokens_per_s")
    for row in rows.values():
        row["vs_env"] = round(row["model_tokens_per_s"] / base, 3) if base and row["model_tokens_per_s"] else None
    return rows


def parse(argv: list[str] | None) -> GWSettings:
    from seer.config_help import field_comments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    helps = field_comments(GWSettings)
    for name, default in asdict(GWSettings()).items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default,
                        help=f"{helps[name]} (default: {default})")
    return GWSettings(**vars(ap.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    s = parse(argv)
    if any(c.startswith("gateway") for c in s.configs.split(",")):
        try:
            import seer.rollout.gateway  # noqa: F401
        except ImportError:
            print("bench.agent_gateway: the gateway configurations need seer.rollout.gateway, which this "
                  "checkout does not have yet (a skeleton until issue 30's gateway lands); nothing recorded")
            return 2
    raise SystemExit("bench.agent_gateway: the run itself is completed with the gateway (run_gateway_iteration); "
                     f"settings were {json.dumps(asdict(s))}")


if __name__ == "__main__":
    raise SystemExit(main())
