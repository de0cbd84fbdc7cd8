"""The calculator task as an `Environment` and as a gateway agent, in one run: `python -m bench.agent_gateway`

Issue 30, item 6. The parts that need no instance are tested in tests/bench/test_agent_gateway_parts.py.

    python -m bench.agent_gateway                              # the comparison docs/agents.md quotes
    python -m bench.agent_gateway --iterations 1 --repeats 1 --groups 4   # a quick look
    python -m bench.agent_gateway --replay-model 1024x8        # the same, timed on a larger model
    python -m bench.agent_gateway --render DIR                 # re-summarize DIR/agent_gateway*.json

What it measures, on real instances over the KV pool with context-aware scheduling:
- env: the built-in calculator task on multi-turn rollout (seer.rollout.multi_turn), its
  `CalculatorEnv` in the environment workers (`--env-mode`, process by default);
- gateway: the same task through the OpenAI-compatible gateway, played by the ordinary
  `openai`-client agent (seer.tasks.agents.calculator_openai's loop, `--agent-mode` process or loop);
- gateway_loop: the same with `agent.mode: loop` (the agents on the driver's event loop, no process
  per session), which separates what containing the agent costs from what the gateway costs;
- gateway_sticky: the gateway with session-sticky scheduling (seer.scheduler.policies.sticky, whole
  turns, the pool unused), as the peers pin a session to one engine.

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

The gateway's cost per call is its own work for one chat call, timed in the driver's process: the
request's time in the server (the ASGI app for agents in processes of their own; the in-process
transport for agents on the driver's loop, which take the runner's `http_client`) less the time its
turn spent in the scheduler (parsing, checks, rendering, the response), plus the synchronous work of matching and tokenizing the call against its
session (`Gateway._take`) and of delivering the turn (`Gateway._deliver`: decode, parse the tool
call, re-render). It is wall time on the driver's event loop: on a busy loop it includes waiting
there behind other work (the scheduler; with `agent.mode: loop`, the agents' own clients). The
agents' processes are in the configuration's tokens/s, not in this number.

A larger model (`--replay-model`): the calculator's own model is tiny (~1 ms of aggregate model time per
token, mostly vLLM's per-step overhead), so a fixed per-call cost of the client weighs far more against
it than against a real model. With `--replay-model` the warm-up still runs the calculator's model (its
trajectories have the task's shape), and the timed runs replay those tokens on instances of the larger
model: replay generates each turn's recorded length and returns the recorded tokens, so the larger
model's skill never matters (an untrained one of the same byte vocabulary serves), only its cost. The
run also measures that model's decode time per token (`decode_probe`): one request alone, and as many at
once as a timed iteration runs.

Writes <out>/agent_gateway.json and agent_gateway.md, or agent_gateway_<replay model>.json/.md with
`--replay-model` (default out: bench/results/agent_gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import os
import platform
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
CONFIGS = ("env", "gateway", "gateway_loop", "gateway_sticky")
AGENT = "seer.tasks.agents.calculator_openai:agent"  # the agent of the gateway configurations


@dataclass(frozen=True)
class GWSettings:
    model: str = "calc"  # the calculator task's own embedded model
    groups: int = 16  # prompts per iteration
    group_size: int = 8  # sessions (trajectories) per prompt
    iterations: int = 2  # rollout iterations per configuration and repeat
    repeats: int = 2  # runs of every configuration, alternating order
    max_tokens: int = 640  # a trajectory's budget
    max_call_tokens: int = 128  # what one gateway call may generate (rollout.max_tokens of a gateway run)
    chunk_size: int = 64  # tokens per chunk
    instances: int = 2  # vLLM instances, one CPU core each
    kv_cache_bytes: int = 16 << 20  # per instance
    max_num_seqs: int = 128  # vLLM's --max-num-seqs per instance
    max_model_len: int = 1024  # the instances' context length (the gateway's session bound)
    kv_pool_bytes: int = 1 << 30  # memory of the Mooncake pool
    temperature: float = 1.0  # the warm-up's sampling temperature (every run's sampling parameters)
    latency_median_s: float = 0.08  # the calculator's tool latency (lognormal), recorded per group and turn
    latency_sigma: float = 0.7  # the tool latency's lognormal sigma
    agent_mode: str = "process"  # agent.mode of the gateway and gateway_sticky configurations
    env_mode: str = "process"  # env.mode of the env configuration (its environment workers)
    configs: str = ",".join(CONFIGS)  # comma-separated, of env, gateway, gateway_loop, gateway_sticky
    seed: int = 0  # seeds the prompts, the warm-up's sampling and the tool latencies
    replay_model: str = ""  # time on this model instead ('' = `model`): a preset, or HIDDENxLAYERS (untrained qwen2)
    out: str = str(OUT)  # where the json and md go

    def __post_init__(self) -> None:
        unknown = [c for c in self.configs.split(",") if c not in CONFIGS]
        if unknown:
            raise ValueError(f"unknown configurations {unknown}; known: {list(CONFIGS)}")
        if self.agent_mode not in ("process", "loop"):
            raise ValueError(f"agent_mode must be process or loop, got {self.agent_mode!r}")
        if self.replay_model:
            replay_preset(self.replay_model)  # fails early on a bad name

    @property
    def stem(self) -> str:
        """The result files' name: agent_gateway, or agent_gateway_<replay model>."""
        return "agent_gateway" + (f"_{self.replay_model}" if self.replay_model else "")


def replay_preset(name: str):
    """The timed runs' model of `--replay-model`: a preset by name, or HIDDENxLAYERS, an untrained qwen2
    of the presets' byte vocabulary (head_dim 64, a quarter of the heads for keys and values, MLP 8/3
    of hidden as Llama's), which replay needs for its cost only."""
    from seer.model.presets import PRESETS, ArchSpec, ModelPreset, get_preset

    if name in PRESETS:
        return get_preset(name)
    try:
        hidden, layers = (int(x) for x in name.split("x"))
    except ValueError:
        raise ValueError(f"--replay-model: a preset ({', '.join(PRESETS)}) or HIDDENxLAYERS, got {name!r}") from None
    heads = max(1, hidden // 64)
    return ModelPreset(name=f"replay-{name}", arch=ArchSpec(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=max(1, heads // 4),
        intermediate_size=(8 * hidden // 3 + 63) // 64 * 64), warm_start=None)


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

STICKY = "seer.scheduler.policies.sticky:SessionSticky"  # bench.multiturn_compare's session-sticky routing


@dataclass
class Workload:
    """One iteration's prompts (group j of iteration i is global group i * groups + j), their scripts
    by (j, sample) and prompt lengths by j."""

    prompts: list
    scripts: dict[tuple[int, int], TokenScript]
    prompt_lens: dict[int, int]


def _replayed(clients, w: Workload) -> list[TokenReplayBackend]:
    return [TokenReplayBackend(c, w.scripts, w.prompt_lens) for c in clients]


def _scheduler(s: GWSettings, policy: str, pooled: bool, chunk_size: int):
    from seer.scheduler import SchedulerConfig

    return SchedulerConfig(policy=policy, chunk_size=chunk_size, max_running=s.max_num_seqs, kv_pool=pooled)


async def run_env_iteration(ctx, prompts, s: GWSettings, iteration: int):
    """One iteration of the env configuration: multi-turn rollout with the calculator environment
    over `TokenReplayBackend`s (ctx: a RolloutContext whose backends and env runner the caller built;
    the prompts' references hold the recorded `latencies`)."""
    from seer.rollout.base import RolloutRequest
    from seer.rollout.multi_turn import multi_turn_rollout
    from seer.types import SamplingParams

    return await multi_turn_rollout(ctx, RolloutRequest(iteration, prompts, s.group_size, SamplingParams(
        temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed)))


async def run_gateway_iteration(ctx, prompts, s: GWSettings, iteration: int, policy: str = "context"):
    """One iteration through the gateway: every session the calculator's `openai`-client agent
    (ctx.agents), every call a turn of the scheduler (`policy` as ctx.scheduler names it)."""
    from seer.rollout.base import RolloutRequest
    from seer.rollout.gateway import gateway_rollout
    from seer.types import SamplingParams

    return await gateway_rollout(ctx, RolloutRequest(iteration, prompts, s.group_size, SamplingParams(
        temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed)))


class CallClock:
    """The gateway's own time per chat call (see the module's docstring): a wrapper of either door (the
    ASGI app, the in-process transport) times each request, the turn's time in the scheduler (from
    `submit` to its result) is taken off, and the gateway's synchronous session work (`_take`,
    `_deliver`) is added."""

    def __init__(self, gw) -> None:
        self.handler_s: list[float] = []  # per chat call: the request's time in the server less its turn
        self.session_s = 0.0  # _take and _deliver, all calls
        self._turn: contextvars.ContextVar[dict | None] = contextvars.ContextVar("turn", default=None)
        submit, take, deliver = gw.submit, gw._take, gw._deliver

        async def timed_submit(sess, call):
            holder = self._turn.get()
            if holder is not None:
                holder["submit"] = time.perf_counter()
                call.result.add_done_callback(lambda _f: holder.__setitem__("done", time.perf_counter()))
            return await submit(sess, call)

        def timed(fn):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.session_s += time.perf_counter() - t0
            return wrapper

        gw.submit, gw._take, gw._deliver = timed_submit, timed(take), timed(deliver)

    async def _timed(self, serve):
        """Time one chat request through `serve` (an awaitable), less its turn's time."""
        holder: dict = {}
        token = self._turn.set(holder)
        t0 = time.perf_counter()
        try:
            return await serve
        finally:
            self._turn.reset(token)
            wall = time.perf_counter() - t0
            if "submit" in holder and "done" in holder:
                self.handler_s.append(wall - (holder["done"] - holder["submit"]))

    def asgi(self, app):
        """The socket door: the ASGI app, sending its answer included."""
        async def wrapped(scope, receive, send):
            if scope.get("type") != "http" or not scope.get("path", "").endswith("/chat/completions"):
                return await app(scope, receive, send)
            return await self._timed(app(scope, receive, send))
        return wrapped

    def in_process(self, factory):
        """The in-process door (agents on the driver's loop): the transport's whole request."""
        def make():
            transport = factory()
            handle = transport.handle_async_request

            async def timed(request):
                if not request.url.path.endswith("/chat/completions"):
                    return await handle(request)
                return await self._timed(handle(request))
            transport.handle_async_request = timed
            return transport
        return make

    def take(self) -> dict:
        """The calls since the last take: how many, and the gateway's seconds for them."""
        out = {"calls": len(self.handler_s), "handler_s": sum(self.handler_s), "session_s": self.session_s}
        self.handler_s, self.session_s = [], 0.0
        return out


async def start_gateway(tok, model_dir: Path, s: GWSettings):
    """The gateway as seer-run builds it (seer.job: the model's chat format, its tokenizer), served on
    127.0.0.1, with a CallClock on it."""
    from seer.model.chat import chat_format, max_token_chars
    from seer.rollout.gateway import Gateway, GatewayConfig, GatewayLimits, GatewayServer
    from seer.rollout.gateway import server as server_module

    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type", "")
    gw = Gateway(chat_format(tok, model_type), lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
                 lambda ids: tok.decode(ids, skip_special_tokens=False),
                 lambda ids: tok.decode(ids, skip_special_tokens=True), tok.eos_token or "", GatewayConfig.model_name,
                 GatewayLimits(max_call_tokens=s.max_call_tokens, max_context_tokens=s.max_model_len,
                               max_token_chars=max_token_chars(tok)))
    clock = CallClock(gw)
    server = GatewayServer(gw, "127.0.0.1")
    build = server_module.build_app
    server_module.build_app = lambda g: clock.asgi(build(g))  # GatewayServer.start builds its app here
    try:
        await server.start()
    finally:
        server_module.build_app = build
    gw.in_process = clock.in_process(gw.in_process)
    return gw, server, clock


def iteration_metrics(batch, wall_s: float, calls: dict | None) -> dict:
    """One iteration's numbers: model tokens over its wall time, chunks, and the gateway's calls."""
    model_tokens = sum(c.new_tokens for c in batch.chunks)
    m = {"wall_s": wall_s, "model_tokens": model_tokens, "tokens_per_s": model_tokens / wall_s if wall_s else 0.0,
         "samples": len(batch.samples), "turns": sum(x.turns for x in batch.samples),
         "chunks": len(batch.chunks), "migrated": sum(1 for c in batch.chunks if c.migrated),
         "rewards": [x.reward for x in sorted(batch.samples, key=lambda x: (x.group_id, x.sample_index))]}
    if calls is not None:
        extra = batch.stats.extra
        m.update(calls=extra.get("gateway_calls"), branches=extra.get("gateway_branches"),
                 # every failed session, the agent's own and the system's (issue 36 split them in the record)
                 agent_errors=(extra.get("agent_errors") or 0) + len({x.session for x in batch.samples
                                                                      if x.failure == "system"}),
                 agent_error_messages=[*extra.get("agent_error_messages", []), *extra.get("system_error_messages", [])],
                 clocked_calls=calls["calls"], handler_s=calls["handler_s"], session_s=calls["session_s"])
    return m


def _records(s: GWSettings, n_groups: int, tok) -> list:
    from seer.tasks import TaskConfig, encode_prompts, load_task

    task = load_task(TaskConfig(name="calculator", num_prompts=n_groups, seed=s.seed))
    return encode_prompts(task.records, tok, s.max_model_len, min_new_tokens=s.max_tokens + s.max_call_tokens)


def workloads(s: GWSettings, prompts: list, samples: list) -> tuple[list[Workload], dict]:
    """Per iteration, its prompts (references with the recorded tool latencies, per group and call)
    and the warm-up's scripts; and what the warm-up generated."""
    from seer.sim.scripts import tool_latencies
    from seer.types import PromptSpec

    by = {(x.group_id, x.sample_index): x for x in samples}
    out = []
    for it in range(s.iterations):
        ps, scripts, lens = [], {}, {}
        for j in range(s.groups):
            g = it * s.groups + j
            p = prompts[g]
            calls = max(by[(g, k)].turns for k in range(s.group_size)) + 1
            ref = {**p.reference, "latencies": tool_latencies(f"{s.seed}:{g}", calls, s.latency_median_s, s.latency_sigma)}
            ps.append(PromptSpec(j, p.text, list(p.prompt_ids), ref))
            lens[j] = len(p.prompt_ids)
            for k in range(s.group_size):
                scripts[(j, k)] = TokenScript.of(by[(g, k)].response_ids, by[(g, k)].loss_mask)
        out.append(Workload(ps, scripts, lens))
    longest_turn = max(len(t) for w in out for sc in w.scripts.values() for t in sc.turns)
    warm = {"trajectories": len(samples), "model_tokens": sum(sum(x.loss_mask or []) for x in samples),
            "turns_median": statistics.median(x.turns for x in samples), "turns_max": max(x.turns for x in samples),
            "longest_turn_tokens": longest_turn,
            "cut_by_budget": sum(1 for x in samples if x.finish_reason == "length"),
            "reward_mean": statistics.mean(x.reward or 0.0 for x in samples)}
    return out, warm


async def compare(clients, s: GWSettings, tok, model_dir: Path, prompts: list, runs: list[dict],
                  checks: list[dict], progress, samples: list | None = None) -> dict:
    """The warm-up (unless its `samples` are given: recorded on other instances), then every
    configuration and repeat over `clients` (real instances, or any InstanceBackends with
    reset_prefix_cache); appends to `runs` and `checks`; returns the warm-up's numbers."""
    from seer.rollout.agents import AgentConfig, AgentRunner, AgentSpec
    from seer.rollout.base import RolloutContext
    from seer.tasks.env import EnvConfig, EnvRunner
    from seer.tasks.reward import RewardRunner

    from bench.multiturn_compare import _reset, calculator_samples

    configs = s.configs.split(",")
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    encode = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    env = EnvRunner("calculator", EnvConfig(mode=s.env_mode, workers=min(16, s.groups * s.group_size),
                                            max_turns=32), {})
    runners = {mode: AgentRunner(AgentSpec.parse(AGENT, 600.0, args={"latency_median_s": 0.0},
                                                 cfg=AgentConfig(mode=mode)), s.groups * s.group_size)
               for mode in dict.fromkeys((s.agent_mode, "loop"))}
    gw, server, clock = await start_gateway(tok, model_dir, s)
    try:
        if samples is None:
            samples = await calculator_samples(clients, s, prompts, model_dir, kv_pool=True, tok=tok)
        works, warm = workloads(s, prompts, samples)
        progress(f"warm-up: {json.dumps(warm)}")

        async def one(name: str, w: Workload, it: int, prefix_it: int):
            await _reset(clients, True)
            pooled = name != "gateway_sticky"
            sched = _scheduler(s, "context" if pooled else STICKY, pooled,
                               s.chunk_size if pooled else s.max_call_tokens)
            rewards = RewardRunner("seer.tasks.calculator:score")
            try:
                agents = runners["loop" if name == "gateway_loop" else s.agent_mode]
                ctx = RolloutContext(_replayed(clients, w), sched, rewards, env=env, decode=decode,
                                     encode=encode, gateway=gw, agents=agents)
                clock.take()
                t = time.perf_counter()
                if name == "env":
                    batch = await run_env_iteration(ctx, w.prompts, s, prefix_it)
                else:
                    batch = await run_gateway_iteration(ctx, w.prompts, s, prefix_it)
                wall = time.perf_counter() - t
            finally:
                rewards.close()
            return batch, iteration_metrics(batch, wall, None if name == "env" else clock.take())

        # untimed: every configuration once on a small iteration (the agent host, the env workers start)
        small = Workload(works[0].prompts[:2], {k: v for k, v in works[0].scripts.items() if k[0] < 2},
                         {j: n for j, n in works[0].prompt_lens.items() if j < 2})
        for n, name in enumerate(configs):
            await one(name, small, 0, 10_000 + n)
        serial = 0
        for rep in range(s.repeats):
            for pos, name in enumerate(order(configs, rep)):
                for it, w in enumerate(works):
                    serial += 1
                    batch, m = await one(name, w, it, serial)
                    runs.append({"config": name, "repeat": rep, "iteration": it, "position": pos, **m})
                    checks.append({"config": name, "repeat": rep, "iteration": it, "env_of": (rep, it),
                                   "samples": batch.samples})
                    progress(f"repeat {rep} {name:14s} it {it}: {m['tokens_per_s']:7.1f} tok/s  wall "
                             f"{m['wall_s']:5.2f} s" + (f"  calls {m['calls']}  gateway "
                                                       f"{1e3 * (m['handler_s'] + m['session_s']) / max(1, m['clocked_calls']):.2f} ms/call"
                                                       if name != "env" else ""))
        return warm
    finally:
        for runner in runners.values():
            await runner.close()
        await server.close()
        env.close()



def run(s: GWSettings, progress=print) -> dict:
    from transformers import AutoTokenizer

    from seer.fleet.pool import InstancePool
    from seer.kvpool import KVPool
    from seer.kvpool.config import KVPoolConfig
    from seer.model import ensure_model
    from seer.procs import cpu_sets

    from bench.harness.instances import instance_specs
    from bench.multiturn_compare import _commit, _reset, calculator_samples

    model_dir = ensure_model(s.model)
    timed_dir = ensure_model(replay_preset(s.replay_model)) if s.replay_model else model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = _records(s, s.groups * s.iterations, tok)
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    provenance = _commit()
    t0 = time.monotonic()
    kv = KVPool.start(KVPoolConfig(capacity_bytes=s.kv_pool_bytes), out / "kvpool")
    runs: list[dict] = []
    checks: list[dict] = []
    probes: dict[str, dict] = {}

    def on_instances(directory: Path, body):
        """`body(clients)` on fresh instances of `directory`'s model, after its decode probe."""
        specs = [kv.configure(x) for x in instance_specs(s, directory, cpu_sets(s.instances), prefix="pool-inst")]
        progress(f"starting {len(specs)} vLLM instances of {directory.name} on the KV pool")
        with InstancePool.launch(specs, out / "logs") as ipool:
            progress(f"instances ready in {time.monotonic() - t0:.0f} s")

            async def go():
                try:
                    await _reset(ipool.clients, True)  # the pool may hold another model's KV
                    probes[directory.name] = await decode_probe(ipool.clients[0], prompts, s)
                    progress(f"decode probe {directory.name}: {json.dumps(probes[directory.name])}")
                    return await body(ipool.clients)
                finally:
                    await ipool.aclose_clients()

            return asyncio.run(go())

    try:
        samples = None
        if timed_dir != model_dir:  # the warm-up on the task's model, the timed runs on the larger one
            samples = on_instances(model_dir, lambda clients: calculator_samples(
                clients, s, prompts, model_dir, kv_pool=True, tok=tok))
        warm = on_instances(timed_dir, lambda clients: compare(
            clients, s, tok, model_dir, prompts, runs, checks, progress, samples=samples))
    finally:
        kv.close()
    warm["decode_probe"] = probes
    warm["timed_model"] = timed_dir.name
    tokens = token_checks(checks)
    return write(s, runs, warm, tokens, out, time.monotonic() - t0, provenance)


async def decode_probe(client, prompts: list, s: GWSettings, tokens: int = 64) -> dict:
    """The model's decode time per token on one instance, measured before the timed runs: one request
    alone (ms per token of a sequence), then as many at once as the iterations' sessions per instance
    (ms per step, and the instance's ms per token over all of them). Salted: no cached prefix."""
    from seer.types import GenerateRequest, SamplingParams

    async def batch(n: int, tag: str) -> float:
        sampling = SamplingParams(temperature=1.0, max_tokens=tokens, seed=s.seed, ignore_eos=True)
        reqs = [GenerateRequest(f"probe-{tag}-{i}", list(prompts[i % len(prompts)].prompt_ids), tokens, sampling,
                                logprobs=False, cache_salt=f"probe-{tag}-{i}") for i in range(n)]
        t = time.perf_counter()
        outs = await asyncio.gather(*(client.generate(r) for r in reqs))
        wall = time.perf_counter() - t
        if any(len(o.token_ids) != tokens for o in outs):
            raise RuntimeError("decode probe: a request ended early")
        return wall

    await batch(1, "warm")
    alone = await batch(1, "alone")
    n = max(1, min(s.max_num_seqs, s.groups * s.group_size // s.instances))
    together = await batch(n, "together")
    return {"tokens": tokens, "alone_ms_per_token": round(1e3 * alone / tokens, 3), "together": n,
            "together_ms_per_step": round(1e3 * together / tokens, 3),
            "together_ms_per_token": round(1e3 * together / (tokens * n), 3)}


def token_checks(checks: list[dict]) -> dict:
    """Per gateway configuration: its samples against the env run's of the same repeat and iteration."""
    out: dict[str, dict] = {}
    for c in checks:
        if c["config"] == "env":
            continue
        env = next((x for x in checks if x["config"] == "env" and x["env_of"] == c["env_of"]), None)
        if env is None:
            continue
        r = same_tokens(env["samples"], c["samples"])
        same_reward = sum(1 for a, b in zip(sorted(env["samples"], key=_key), sorted(c["samples"], key=_key))
                          if a.reward == b.reward)
        row = out.setdefault(c["config"], {"samples": 0, "same": 0, "same_reward": 0, "differ": []})
        row["samples"] += r["samples"]
        row["same"] += r["same"]
        row["same_reward"] += same_reward
        row["differ"] += [[c["repeat"], c["iteration"], *d] for d in r["differ"]][:10 - len(row["differ"])]
    return out


def _key(x):
    return (x.group_id, x.sample_index)


def summarize(runs: Sequence[dict]) -> dict:
    """Per configuration: model tokens/s over all its iterations' wall time (and its min-max over
    repeats), the ratio to env (per repeat, then the mean), and for the gateway its cost per call."""
    rows: dict[str, dict] = {}
    for name in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == name]
        tokens, wall = sum(r["model_tokens"] for r in mine), sum(r["wall_s"] for r in mine)
        rows[name] = {"iterations": len(mine), "model_tokens": tokens, "wall_s": round(wall, 3),
                      "model_tokens_per_s": round(tokens / wall, 1) if wall else None,
                      "wall_s_median": round(statistics.median(r["wall_s"] for r in mine), 3)}
        reps = sorted({r.get("repeat", 0) for r in mine})
        tps = {rep: sum(r["model_tokens"] for r in mine if r.get("repeat", 0) == rep)
               / sum(r["wall_s"] for r in mine if r.get("repeat", 0) == rep) for rep in reps}
        rows[name]["tokens_per_s_by_repeat"] = {str(k): round(v, 1) for k, v in tps.items()}
        rows[name]["model_tokens_per_s_min"] = round(min(tps.values()), 1)
        rows[name]["model_tokens_per_s_max"] = round(max(tps.values()), 1)
        if all("calls" in r for r in mine):
            calls = sum(r["calls"] or 0 for r in mine)
            clocked = sum(r["clocked_calls"] for r in mine)
            handler, session = sum(r["handler_s"] for r in mine), sum(r["session_s"] for r in mine)
            rows[name].update(
                calls=calls, calls_per_iteration=round(calls / len(mine), 1),
                gateway_ms_per_call=round(1e3 * (handler + session) / clocked, 3) if clocked else None,
                handler_ms_per_call=round(1e3 * handler / clocked, 3) if clocked else None,
                session_ms_per_call=round(1e3 * session / clocked, 3) if clocked else None,
                gateway_share_of_wall=round((handler + session) / wall, 4) if wall else None,
                branches=sum(r["branches"] or 0 for r in mine), agent_errors=sum(r["agent_errors"] or 0 for r in mine))
    base = rows.get("env", {}).get("model_tokens_per_s")
    env_by_rep = rows.get("env", {}).get("tokens_per_s_by_repeat", {})
    for row in rows.values():
        row["vs_env"] = round(row["model_tokens_per_s"] / base, 3) if base and row["model_tokens_per_s"] else None
        pairs = [v / env_by_rep[k] for k, v in row["tokens_per_s_by_repeat"].items() if env_by_rep.get(k)]
        row["vs_env_by_repeat"] = [round(x, 3) for x in pairs]
    return rows


LABELS = {"env": "the calculator as an `Environment` (multi-turn rollout), context-aware on the pool",
          "gateway": "the `openai`-client agent through the gateway, context-aware on the pool",
          "gateway_loop": "the same, the agents on the driver's event loop (`agent.mode: loop`)",
          "gateway_sticky": "the same agent through the gateway, session-sticky (whole turns, no pool)"}


def command_line(s: GWSettings) -> str:
    base = GWSettings()
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in asdict(s).items() if v != getattr(base, k)]
    return " ".join(["python -m bench.agent_gateway", *flags])


def write(s: GWSettings, runs: list[dict], warm: dict, tokens: dict, out: Path, elapsed_s: float,
          provenance: dict) -> dict:
    result = {"bench": "agent_gateway", "command": command_line(s), "settings": asdict(s),
              "machine": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "elapsed_s": round(elapsed_s, 1), **provenance, "warm_up": warm, "configs": summarize(runs),
              "same_tokens": tokens, "runs": runs}
    (out / f"{s.stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / f"{s.stem}.md").write_text(markdown(result) + "\n")
    return result


def markdown(result: dict) -> str:
    s, rows, tokens = result["settings"], result["configs"], result["same_tokens"]
    lines = [
        f"`{result['command']}` (commit {result.get('commit', '?')}{', dirty' if result.get('dirty') else ''}; "
        f"calculator task, model `{s['model']}`, {s['groups']} groups x G={s['group_size']} per iteration, "
        f"{s['iterations']} iterations per configuration and repeat, {s['repeats']} repeats alternating, "
        f"{s['instances']} instances x 1 core on the KV pool, chunk {s['chunk_size']}, tool latency lognormal "
        f"median {s['latency_median_s']} s sigma {s['latency_sigma']} (recorded per group and call), agent mode "
        f"`{s['agent_mode']}` but in gateway_loop; {result.get('elapsed_s', 0):.0f} s in all, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in result.get('load_average', []))})",
        "",
        "| configuration | model tok/s (min-max) | vs env (per repeat) | wall s / iteration | calls / iteration | "
        "gateway ms / call (request / session) | gateway share of wall | same tokens as env | same reward |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        ratio = "-" if r["vs_env"] is None else f"{r['vs_env']:.3f} ({', '.join(f'{x:.3f}' for x in r['vs_env_by_repeat'])})"
        gw = r.get("gateway_ms_per_call")
        cost = "-" if gw is None else f"{gw:.2f} ({r['handler_ms_per_call']:.2f} / {r['session_ms_per_call']:.2f})"
        share = "-" if r.get("gateway_share_of_wall") is None else f"{100 * r['gateway_share_of_wall']:.1f}%"
        t = tokens.get(name)
        same = "-" if t is None else f"{t['same']}/{t['samples']}"
        rew = "-" if t is None else f"{t['same_reward']}/{t['samples']}"
        calls = "-" if "calls_per_iteration" not in r else f"{r['calls_per_iteration']:.0f}"
        lines.append(f"| {LABELS.get(name, name)} | {r['model_tokens_per_s']:.0f} ({r['model_tokens_per_s_min']:.0f}-"
                     f"{r['model_tokens_per_s_max']:.0f}) | {ratio} | {r['wall_s'] / r['iterations']:.2f} | {calls} | "
                     f"{cost} | {share} | {same} | {rew} |")
    lines += why(rows)
    w = result.get("warm_up", {})
    lines += probe_lines(s, w)
    lines += ["", f"Warm-up (the model on the real environment, untimed): {w.get('trajectories')} trajectories, "
              f"{w.get('model_tokens')} model tokens, turns median {w.get('turns_median')} max {w.get('turns_max')}, "
              f"longest turn {w.get('longest_turn_tokens')} tokens, {w.get('cut_by_budget')} cut by the budget.",
              "", "Columns: model tok/s = the model's tokens (observations excluded) of every iteration over their "
              "wall time (min-max over repeats); vs env = the ratio to the env configuration of the same repeat; "
              "gateway ms / call = the gateway's own time per chat call in the driver's process: the request's time "
              "in the server less its turn's time in the scheduler, and the session's matching, tokenizing and "
              "delivering (`Gateway._take`, `_deliver`); share of wall = that time over all calls, over the "
              "iterations' wall time; same tokens = samples whose prompt, response tokens and loss mask equal the "
              "env run's of the same repeat and iteration (replayed model tokens and tool latencies)."]
    return "\n".join(lines)


def why(rows: dict) -> list[str]:
    """Where a gateway configuration's extra wall time per call goes, against env (the bar: at most
    5% fewer model tokens/s), from the recorded numbers."""
    env = rows.get("env")
    out = []
    for name, r in rows.items():
        if env is None or name == "env" or not r.get("calls"):
            continue
        calls = r["calls_per_iteration"]
        env_wall, wall = env["wall_s"] / env["iterations"], r["wall_s"] / r["iterations"]
        extra_ms = 1e3 * (wall - env_wall) / calls
        gw = r["gateway_ms_per_call"]
        loop = name == "gateway_loop"
        waits = "scheduler and the agents' clients" if loop else "scheduler"
        who = "clients" if loop else "clients and processes"
        out.append(f"- {name}: a call carries {r['model_tokens'] / r['iterations'] / calls:.0f} model tokens, "
                   f"which the env path turns over in {1e3 * env_wall / calls:.1f} ms of its iteration's wall; "
                   f"through the gateway the iteration is {extra_ms:.1f} ms longer per call. The gateway's own time "
                   f"is {gw:.2f} ms per call of wall on the driver's loop (its work, and its waits there behind the "
                   f"{waits}), overlapping the instances' work; the agents' {who} run on the same cores.")
    if out:
        out = ["", "Where the time per call goes (against env, per iteration):", *out]
    return out


def probe_lines(s: dict, warm: dict) -> list[str]:
    """The timed model and its measured decode time per token (runs recorded before the probe: none)."""
    probes = warm.get("decode_probe")
    if not probes:
        return []
    timed = warm.get("timed_model", s["model"])
    out = ["", f"Timed on `{timed}`" + (f" (`--replay-model {s['replay_model']}`: the warm-up's trajectories of "
                                        f"`{s['model']}` replayed on it, token for token)" if s.get("replay_model") else "")
           + "; the models' decode time per token, measured in this run on one fresh instance before its runs "
           f"({next(iter(probes.values()))['tokens']} tokens per request, the prompts' prefill included):"]
    for name, p in probes.items():
        out.append(f"- `{name}`: one request alone {p['alone_ms_per_token']:.2f} ms per token; {p['together']} at once "
                   f"{p['together_ms_per_step']:.1f} ms per step, {p['together_ms_per_token']:.3f} ms per token of the instance")
    return out


def render(out: Path) -> dict:
    """Rewrite every `out/agent_gateway*.md` from its json with this code (returns the last)."""
    old: dict = {}
    for path in sorted(out.glob("agent_gateway*.json")):
        old = json.loads(path.read_text())
        old["configs"] = summarize(old["runs"])
        path.with_suffix(".md").write_text(markdown(old) + "\n")
    return old


def parse(argv: list[str] | None) -> GWSettings:
    from seer.config_help import field_comments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    helps = field_comments(GWSettings)
    for name, default in asdict(GWSettings()).items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default,
                        help=f"{helps[name]} (default: {default})".replace("%", "%%"))
    return GWSettings(**vars(ap.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    from bench.harness.instances import run_command

    return run_command(argv, parse, run, markdown, render)


if __name__ == "__main__":
    raise SystemExit(main())
