"""Multi-turn rollout, four ways, on real vLLM instances: `python -m bench.multiturn_compare`.

    python -m bench.multiturn_compare                      # the README's table (calc model, 2 instances)
    python -m bench.multiturn_compare --iterations 2 --repeats 1 --groups 4   # a quick look
    python -m bench.multiturn_compare --render DIR         # re-summarize DIR/multiturn_compare.json

The built-in multi-turn task (task.name=calculator: the model calls a calculator once per turn and
copies its answer forward) with replayed lengths and tool latencies: an untimed warm-up runs the
`calc` model against the real calculator environment once, and records every trajectory's turn
lengths and observations (seer.sim.scripts); tool latencies are lognormal draws fixed per
trajectory and turn (`--latency-median-s`, `--latency-sigma`). Every configuration and repeat then
generates exactly those turns with the model and waits exactly those latencies, so they differ by
scheduling only:

- sticky: session-sticky routing with prefix caching, as verl and slime serve agents: a trajectory's
  first turn goes to the least busy engine and every later turn back to it, one engine request per
  turn (seer.scheduler.policies.sticky); instances without a KV pool.
- april: the same, plus APRIL-style partial rollout: every iteration issues `--over-issue` more
  groups than the batch, keeps the first `--groups` groups that finish and carries the unfinished
  trajectories, as they are, into the next iteration (their engine again). The share of the kept
  model tokens generated in an earlier iteration is what training would take off-policy.
- seer: turns on divided rollout (`--chunk-size` chunks) over a Mooncake KV pool with
  context-aware scheduling: a turn goes to whichever instance the scheduler picks and loads the
  history from the pool. seer_nopool: the same scheduling on the plain instances (a turn stays with
  its history unless another instance is idle), which separates what the pool costs from the order.
- oracle: oracle longest-first on the same pool (told every trajectory's length).

Each configuration runs `--iterations` rollout iterations of `--groups` x `--group-size`
trajectories (a fresh prefix cache each, as a weight update leaves it); configurations alternate
in order across repeats (forward, then backward). Instances start once: a plain set for the sticky
configurations and a set on the pool for the others, on the same cores (one idles while the other
runs). Reported per configuration: model tokens/s, tail, instance time idle while tools run, the
prefix per continuation turn (cached vs recomputed, and vLLM's own count of tokens loaded from the
pool), and APRIL's off-policy share; a timeline per configuration with turns and tool waits per
instance, in the chunk-timeline format (seer.watch.trace).

Writes <out>/multiturn_compare.json, multiturn_compare.md, throughput.png, timeline.png and one
trace_<config>.json per configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seer import request_ids
from seer.config_help import field_comments
from seer.rollout.stats import stats_from_result
from seer.scheduler import RolloutDriver, SchedulerConfig
from seer.scheduler.turns import StopMatcher
from seer.types import PromptSpec, SamplingParams
from seer.watch.trace import build_trace, write_trace

from seer.sim.ladder import parse_bool
from seer.sim.scripts import Script, continuation_prefix, idle_while_tools, script_from_sample, tool_latencies
from seer.sim.scripts import true_lengths as script_lengths

from bench.harness.replay import ReplayBackend, ReplayEnv, ReplayTable

STICKY = "seer.scheduler.policies.sticky:SessionSticky"


@dataclass(frozen=True)
class MTSettings:
    model: str = "calc"  # an embedded preset (calc: the calculator task's own) or a local HF checkpoint
    groups: int = 16  # groups (prompts) per iteration: the training batch
    group_size: int = 8  # trajectories per group (G)
    iterations: int = 3  # rollout iterations per configuration and repeat
    repeats: int = 2  # runs of every configuration, in alternating order
    max_tokens: int = 640  # a trajectory's budget: every turn and observation
    chunk_size: int = 64  # tokens per chunk of the divided configurations (seer, oracle)
    instances: int = 2  # vLLM instances per set, one CPU core each
    kv_cache_bytes: int = 16 << 20  # per instance
    max_num_seqs: int = 128  # vLLM's --max-num-seqs per instance
    max_model_len: int = 1024  # the instances' context length
    temperature: float = 1.0  # sampling temperature (the warm-up's, and the replay's token choice)
    seed: int = 0  # seeds the prompts, the warm-up's sampling and the tool latencies
    latency_median_s: float = 0.08  # tool latency: lognormal median (the calculator's default)
    latency_sigma: float = 0.7  # tool latency: lognormal sigma
    over_issue: float = 0.5  # april: groups issued beyond the batch, as a share of it
    kv_pool_bytes: int = 1 << 30  # memory of the Mooncake pool under seer and oracle
    configs: str = "sticky,april,seer_nopool,seer,oracle"  # comma-separated, of sticky, april, seer_nopool, seer, oracle
    out: str = "bench/results/multiturn_compare"  # where the json, md, plots and traces go

    def __post_init__(self) -> None:
        if self.groups < 1 or self.group_size < 1 or self.iterations < 1 or self.repeats < 1:
            raise ValueError("groups, group_size, iterations and repeats must be >= 1")
        if self.over_issue < 0:
            raise ValueError("over_issue must be >= 0")
        unknown = [c for c in self.configs.split(",") if c not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown configurations {unknown}; known: {list(BY_NAME)}")


@dataclass(frozen=True)
class MTConfig:
    name: str
    label: str
    policy: str  # a scheduler policy: built-in name or path
    pooled: bool  # on the instances that share the KV pool
    chunked: bool  # False: a whole turn per engine request (the chunk is the trajectory's budget)
    april: bool = False  # partial rollout with carry-over


CONFIGS: tuple[MTConfig, ...] = (
    MTConfig("sticky", "session-sticky + prefix cache (verl, slime)", STICKY, pooled=False, chunked=False),
    MTConfig("april", "session-sticky + APRIL partial rollout", STICKY, pooled=False, chunked=False, april=True),
    # Seer's scheduling on the plain instances: what the pool costs and brings, apart from the ordering
    MTConfig("seer_nopool", "Seer's scheduling without the pool (divided turns, context-aware)", "context",
             pooled=False, chunked=True),
    MTConfig("seer", "Seer: divided turns on the KV pool, context-aware", "context", pooled=True, chunked=True),
    MTConfig("oracle", "oracle longest-first on the KV pool (knows lengths)", "oracle_lfs", pooled=True, chunked=True),
)
BY_NAME = {c.name: c for c in CONFIGS}


@dataclass(frozen=True)
class Trajectory:
    """A trajectory of the workload's stream: global group `group`, sample `sample`."""

    group: int
    sample: int
    prompt_ids: tuple[int, ...]
    script: Script


@dataclass
class Carried:
    """APRIL: a trajectory some iteration issued and none has kept yet (finished or not)."""

    traj: Trajectory
    history: list[int] = field(default_factory=list)  # response tokens so far (turns and observations)
    script: Script | None = None  # what is left; None: as the trajectory's own
    home: str | None = None  # the engine its history is on
    tokens_by_iteration: dict[int, int] = field(default_factory=dict)  # model tokens generated per iteration
    finished: bool = False


@dataclass
class MTRun:
    config: str
    repeat: int
    iteration: int
    position: int  # order of the configuration within the repeat
    stats: dict  # the numbers of one iteration (run_metrics)


# ---- pure accounting ----------------------------------------------------------------------------

def off_policy(kept: Sequence[Carried], iteration: int) -> dict:
    """APRIL: of the kept trajectories' model tokens, those generated in an earlier iteration."""
    total = sum(sum(c.tokens_by_iteration.values()) for c in kept)
    earlier = sum(n for c in kept for it, n in c.tokens_by_iteration.items() if it < iteration)
    ages = [iteration - min(c.tokens_by_iteration) for c in kept if c.tokens_by_iteration]
    return {"kept_trajectories": len(kept), "kept_model_tokens": total, "off_policy_tokens": earlier,
            "off_policy_share": earlier / total if total else 0.0,
            "trajectories_with_earlier_tokens": sum(1 for c in kept if any(it < iteration for it in c.tokens_by_iteration)),
            "max_age_iterations": max(ages, default=0)}


def run_metrics(result, names: Sequence[str], pool_usage, s: MTSettings) -> dict:
    """One iteration's numbers: throughput of model tokens, tail, idle while tools run, prefix reuse."""
    finish = [x.finish_time for x in result.samples]
    stats = stats_from_result(result, 0, list(names), finish_times=finish)
    model_tokens = sum(c.new_tokens for c in result.chunks)
    idle_tools = idle_while_tools(result.chunks, result.env_waits, names, result.start_time, result.end_time)
    wall = result.end_time - result.start_time
    return {
        "wall_s": wall, "model_tokens": model_tokens, "tokens_per_s": model_tokens / wall if wall > 0 else 0.0,
        "tail_s": stats.tail_s, "trajectories": len(result.samples),
        "turns": sum(x.turns for x in result.samples),
        "idle_s": sum(i.idle_s for i in stats.instances),
        "idle_while_tools_s": sum(idle_tools.values()),
        "idle_while_tools_fraction": sum(idle_tools.values()) / (wall * len(names)) if wall > 0 else 0.0,
        "tool_wait_s": sum(w.complete_time - w.dispatch_time for w in result.env_waits),
        "chunks": len(result.chunks), "migrated": sum(1 for c in result.chunks if c.migrated),
        "continuation": continuation_prefix(result.chunks),
        "pool": {"tokens_from_pool": pool_usage.tokens_from_pool, "tokens_local_hit": pool_usage.tokens_local_hit,
                 "tokens_computed": pool_usage.tokens_recomputed},
        "preemptions": stats.preemptions,
        "policy_summary": result.policy_summary,
    }


# ---- running it ---------------------------------------------------------------------------------

def _commit() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--", "seer", "bench", ":!bench/results"))}


def _records(s: MTSettings, n_groups: int, model_dir: Path) -> list[PromptSpec]:
    from transformers import AutoTokenizer

    from seer.tasks import TaskConfig, encode_prompts, load_task

    tok = AutoTokenizer.from_pretrained(model_dir)
    task = load_task(TaskConfig(name="calculator", num_prompts=n_groups, seed=s.seed))
    return encode_prompts(task.records, tok, s.max_model_len, min_new_tokens=s.max_tokens)


def stream_size(s: MTSettings) -> int:
    """Groups the workload needs: what every iteration of the sync configurations uses, and at most
    what APRIL's over-issue draws (each iteration tops the issued groups up with fresh ones)."""
    return s.iterations * max(s.groups, math.ceil(s.groups * (1 + s.over_issue)))


async def warm_up(clients, s: MTSettings, prompts: list[PromptSpec], model_dir: Path, progress) -> list[Trajectory]:
    """The model against the real calculator environment once: every trajectory's script."""
    out = []
    for x in await calculator_samples(clients, s, prompts, model_dir, kv_pool=True):
        lat = tool_latencies(f"{s.seed}:{x.group_id}:{x.sample_index}", max(x.turns, 1), s.latency_median_s,
                             s.latency_sigma)
        out.append(Trajectory(x.group_id, x.sample_index, tuple(prompts[x.group_id].prompt_ids),
                              script_from_sample(x, lat)))
    sc = [t.script for t in out]
    progress(f"warm-up: {len(out)} trajectories, {sum(x.model_tokens for x in sc)} model tokens, turns median "
             f"{statistics.median(len(x.turns) for x in sc)} max {max(len(x.turns) for x in sc)}, longest "
             f"{max(x.response_tokens for x in sc)} tokens")
    return out


async def calculator_samples(clients, s: MTSettings, prompts: list[PromptSpec], model_dir: Path, *,
                             kv_pool: bool, tok=None) -> list:
    """The model's multi-turn samples on the real calculator environment (no tool latency), by group
    and sample (`tok`: the model's tokenizer, loaded from `model_dir` if not given)."""
    from seer.rollout.base import RolloutContext, RolloutRequest
    from seer.rollout.multi_turn import multi_turn_rollout
    from seer.tasks.env import EnvConfig, EnvRunner
    from seer.tasks.reward import RewardRunner

    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
    env = EnvRunner("calculator", EnvConfig(mode="thread", workers=16, max_turns=32), {"latency_median_s": 0.0})
    try:
        ctx = RolloutContext(clients, SchedulerConfig(policy="context", chunk_size=s.chunk_size,
                                                      max_running=s.max_num_seqs, kv_pool=kv_pool),
                             RewardRunner("seer.tasks.env:zero_reward"), env=env,
                             decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                             encode=lambda t: list(tok(t, add_special_tokens=False)["input_ids"]))
        batch = await multi_turn_rollout(ctx, RolloutRequest(0, prompts, s.group_size, SamplingParams(
            temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed)))
    finally:
        env.close()
    return sorted(batch.samples, key=lambda x: (x.group_id, x.sample_index))


async def _reset(clients, pooled: bool) -> None:
    for i, c in enumerate(clients):
        await c.reset_prefix_cache(external=pooled and i == 0)


async def one_iteration(clients, cfg: MTConfig, s: MTSettings, issued: list[tuple[PromptSpec, Script]],
                        group_size: int, prefix: str, kv_bytes: int, *, homes: dict | None = None,
                        stop_when=None):
    """One rollout iteration of `issued` (prompt, script per group; G samples each) under `cfg`."""
    from seer.fleet.measure import counters
    from seer.kvpool.accounting import usage_between

    prompts = [PromptSpec(j, p.text, list(p.prompt_ids), p.reference) for j, (p, _) in enumerate(issued)]
    scripts = {(j, k): sc if isinstance(sc, Script) else sc[k] for j, (_, sc) in enumerate(issued)
               for k in range(group_size)}
    table = ReplayTable(scripts, {j: len(p.prompt_ids) for j, p in enumerate(prompts)})
    await _reset(clients, cfg.pooled)
    sched = SchedulerConfig(policy=cfg.policy, chunk_size=s.chunk_size if cfg.chunked else s.max_tokens,
                            max_running=s.max_num_seqs, kv_pool=cfg.pooled,
                            policy_args={"homes": homes} if homes else {})
    driver = RolloutDriver([ReplayBackend(c, table) for c in clients], sched)
    before = [await counters(c) for c in clients]
    result = await driver.run(
        prompts, group_size=group_size,
        sampling=SamplingParams(temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed),
        request_id_prefix=prefix, true_lengths=script_lengths(scripts) if cfg.policy == "oracle_lfs" else None,
        turns=StopMatcher((), lambda ids: ""), on_turn_end=ReplayEnv(table), stop_when=stop_when)
    await asyncio.sleep(0.3)  # vLLM publishes a step's counters shortly after it
    after = [await counters(c) for c in clients]
    usage = sum((usage_between(b, a, kv_bytes) for b, a in zip(before, after)),
                start=usage_between(before[0], before[0], kv_bytes))
    return result, usage


async def run_sync(clients, cfg: MTConfig, s: MTSettings, trajs: dict, prompts: list[PromptSpec], rep: int,
                   pos: int, kv_bytes: int, traces: dict, progress) -> list[MTRun]:
    """sticky, seer, oracle: every iteration its own `groups` groups, all finished."""
    runs = []
    for it in range(s.iterations):
        groups = range(it * s.groups, (it + 1) * s.groups)
        issued = [(prompts[g], [trajs[(g, k)].script for k in range(s.group_size)]) for g in groups]
        result, usage = await one_iteration(clients, cfg, s, issued, s.group_size, f"r{rep}-{cfg.name}-i{it}-", kv_bytes)
        m = run_metrics(result, [c.name for c in clients], usage, s)
        runs.append(MTRun(cfg.name, rep, it, pos, m))
        _keep_trace(traces, cfg, rep, it, s, result)
        progress(_line(cfg.name, rep, it, m))
    return runs


async def run_april(clients, cfg: MTConfig, s: MTSettings, trajs: dict, prompts: list[PromptSpec], rep: int,
                    pos: int, kv_bytes: int, traces: dict, progress) -> list[MTRun]:
    """APRIL: issue ceil(groups x (1 + over_issue)) groups, keep the first `groups` to finish, carry the rest."""
    runs = []
    pool: list[Carried] = []  # issued, not kept yet
    next_group = 0
    issue = max(s.groups, math.ceil(s.groups * (1 + s.over_issue)))
    for it in range(s.iterations):
        open_groups = list(dict.fromkeys(c.traj.group for c in pool))
        fresh = max(0, issue - len(open_groups))
        for g in range(next_group, next_group + fresh):
            pool += [Carried(trajs[(g, k)]) for k in range(s.group_size)]
        next_group += fresh
        running = [c for c in pool if not c.finished]
        issued, homes = [], {}
        prefix = f"r{rep}-{cfg.name}-i{it}-"
        for j, c in enumerate(running):
            p = prompts[c.traj.group]
            ids = [*c.traj.prompt_ids, *c.history]
            issued.append((PromptSpec(j, p.text, ids, p.reference), c.script or c.traj.script))
            if c.home is not None:
                homes[request_ids.request_id(j, 0, prefix)] = c.home
        done_keys = {(c.traj.group, c.traj.sample) for c in pool if c.finished}
        members = {}
        for c in pool:
            members.setdefault(c.traj.group, set()).add((c.traj.group, c.traj.sample))
        complete: list[int] = []

        def stop_when(samples, _running=running, _done=done_keys, _members=members, _complete=complete) -> bool:
            # The driver may ask again with no new sample (after any wake-up), so read them all.
            for x in samples:
                key = (_running[x.group_id].traj.group, _running[x.group_id].traj.sample)
                _done.add(key)
                if _members[key[0]] <= _done and key[0] not in _complete:
                    _complete.append(key[0])
            return len(_complete) >= s.groups

        result, usage = await one_iteration(clients, cfg, s, issued, 1, prefix, kv_bytes, homes=homes,
                                            stop_when=stop_when)
        for x in result.samples:  # finished this iteration
            c = running[x.group_id]
            new = list(x.response_ids)
            c.tokens_by_iteration[it] = sum(x.loss_mask or [])
            c.history += new
            c.finished = True
        for u in result.unfinished:
            c = running[u.group_id]
            c.tokens_by_iteration[it] = sum(u.loss_mask or [])
            c.history += list(u.response_ids)
            c.script = (c.script or c.traj.script).rebase(len(u.response_ids))
            c.home = u.instances[-1] if u.instances else c.home
        kept = [c for c in pool if c.traj.group in complete]
        pool = [c for c in pool if c.traj.group not in complete]
        m = run_metrics(result, [c.name for c in clients], usage, s)
        m["april"] = {**off_policy(kept, it), "kept_groups": len(set(complete)), "issued_trajectories": len(running),
                      "carried_unfinished": sum(1 for c in pool if not c.finished),
                      "carried_finished": sum(1 for c in pool if c.finished),
                      "aborted_chunks": sum(1 for u in result.unfinished if u.aborted),
                      "fresh_groups": fresh}
        runs.append(MTRun(cfg.name, rep, it, pos, m))
        _keep_trace(traces, cfg, rep, it, s, result)
        progress(_line(cfg.name, rep, it, m) + f"  kept {len(set(complete))} groups, off-policy "
                 f"{m['april']['off_policy_share']:.1%}, carried {m['april']['carried_unfinished']}")
    return runs


def _line(name: str, rep: int, it: int, m: dict) -> str:
    return (f"repeat {rep} {name:7s} it {it}: {m['tokens_per_s']:7.1f} tok/s  wall {m['wall_s']:5.1f} s  tail "
            f"{m['tail_s']:4.1f} s  idle while tools {m['idle_while_tools_fraction']:.0%}")


def _keep_trace(traces: dict, cfg: MTConfig, rep: int, it: int, s: MTSettings, result) -> None:
    """The timeline of repeat 0's second iteration (the first if there is one only): APRIL's shows carry-over."""
    if rep == 0 and it == min(1, s.iterations - 1):
        telemetry = [t for t in result.telemetry if t.time >= result.start_time]
        traces[cfg.name] = build_trace(result.chunks, telemetry, [("generate", result.start_time, result.end_time)],
                                       t0=result.start_time, waits=result.env_waits,
                                       metadata={"config": cfg.name, "iteration": it})


def run(s: MTSettings, progress=print) -> dict:
    from seer.fleet.pool import InstancePool
    from seer.kvpool import KVPool
    from seer.kvpool.accounting import kv_bytes_per_token
    from seer.kvpool.config import KVPoolConfig
    from seer.model import ensure_model
    from seer.procs import cpu_sets

    from bench.harness.instances import instance_specs

    configs = [BY_NAME[n] for n in s.configs.split(",")]
    model_dir = Path(s.model) if Path(s.model).is_dir() else ensure_model(s.model, progress=False)
    kv_bytes = kv_bytes_per_token(model_dir)
    prompts = _records(s, stream_size(s), model_dir)
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    provenance = _commit()
    cores = cpu_sets(s.instances)
    t0 = time.monotonic()
    kv = KVPool.start(KVPoolConfig(capacity_bytes=s.kv_pool_bytes), out / "kvpool")
    runs: list[MTRun] = []
    traces: dict[str, dict] = {}
    try:
        plain = instance_specs(s, model_dir, cores)
        pooled = [kv.configure(x) for x in instance_specs(s, model_dir, cores, prefix="pool-inst")]
        progress(f"starting {len(plain) + len(pooled)} vLLM instances (plain + on the KV pool)")
        with InstancePool.launch(plain + pooled, out / "logs") as ipool:
            progress(f"instances ready in {time.monotonic() - t0:.0f} s")
            plain_c, pool_c = ipool.clients[:len(plain)], ipool.clients[len(plain):]

            async def go():
                try:
                    trajs = {(t.group, t.sample): t for t in await warm_up(pool_c, s, prompts, model_dir, progress)}
                    # an untimed replay on the plain set too, so neither set's first timed run pays start-up
                    warm = MTSettings(**{**asdict(s), "iterations": 1, "groups": min(2, s.groups)})
                    await run_sync(plain_c, BY_NAME["sticky"], warm, trajs, prompts, -1, 0, kv_bytes, {}, lambda m: None)
                    for rep in range(s.repeats):
                        order = configs if rep % 2 == 0 else configs[::-1]
                        for pos, cfg in enumerate(order):
                            clients = pool_c if cfg.pooled else plain_c
                            fn = run_april if cfg.april else run_sync
                            runs.extend(await fn(clients, cfg, s, trajs, prompts, rep, pos, kv_bytes, traces, progress))
                finally:
                    await ipool.aclose_clients()

            asyncio.run(go())
    finally:
        kv.close()
    return write(s, configs, runs, traces, out, time.monotonic() - t0, provenance)


# ---- results ------------------------------------------------------------------------------------

def summarize(s: MTSettings, configs: Sequence[MTConfig], runs: Sequence[MTRun]) -> dict:
    """Per configuration, over every iteration of every repeat: totals (throughput = all model tokens
    over all wall time), means per iteration, spread over repeats, and ratios to sticky."""
    rows = {}
    sticky_tps = {}
    for cfg in configs:
        mine = [r for r in runs if r.config == cfg.name]
        if not mine:
            continue
        by_rep = {}
        for r in mine:
            by_rep.setdefault(r.repeat, []).append(r.stats)
        tps = {rep: sum(m["model_tokens"] for m in ms) / sum(m["wall_s"] for m in ms) for rep, ms in by_rep.items()}
        if cfg.name == "sticky":
            sticky_tps = tps
        ms = [r.stats for r in mine]
        cont = [m["continuation"] for m in ms]
        turns = sum(c["turns"] for c in cont)
        row = {
            "label": cfg.label,
            "tokens_per_s": statistics.mean(tps.values()), "tokens_per_s_min": min(tps.values()),
            "tokens_per_s_max": max(tps.values()),
            "wall_s_per_iteration": statistics.mean(m["wall_s"] for m in ms),
            "tail_s": statistics.mean(m["tail_s"] for m in ms),
            "tail_s_min": min(m["tail_s"] for m in ms), "tail_s_max": max(m["tail_s"] for m in ms),
            "idle_fraction": statistics.mean(m["idle_s"] / (m["wall_s"] * s.instances) for m in ms),
            "idle_while_tools_fraction": statistics.mean(m["idle_while_tools_fraction"] for m in ms),
            "idle_while_tools_s": statistics.mean(m["idle_while_tools_s"] for m in ms),
            "model_tokens_per_iteration": statistics.mean(m["model_tokens"] for m in ms),
            "trajectories_per_iteration": statistics.mean(m["trajectories"] for m in ms),
            "continuation_turns": turns,
            "history_tokens_per_turn": sum(c["history_tokens"] for c in cont) / turns if turns else 0.0,
            "cached_tokens_per_turn": sum(c["cached_tokens"] for c in cont) / turns if turns else 0.0,
            "recomputed_tokens_per_turn": sum(c["recomputed_tokens"] for c in cont) / turns if turns else 0.0,
            "moved_turns_share": sum(c["moved_turns"] for c in cont) / turns if turns else 0.0,
            "pool_tokens_per_turn": sum(m["pool"]["tokens_from_pool"] for m in ms) / turns if turns else 0.0,
            "prompt_tokens_from_pool": sum(m["pool"]["tokens_from_pool"] for m in ms),
            "prompt_tokens_local_hit": sum(m["pool"]["tokens_local_hit"] for m in ms),
            "prompt_tokens_computed": sum(m["pool"]["tokens_computed"] for m in ms),
            "preemptions": statistics.mean(m["preemptions"] for m in ms),
            "ratio": (statistics.mean(tps[rep] / sticky_tps[rep] for rep in tps if rep in sticky_tps)
                      if sticky_tps else None),
        }
        ap = [m["april"] for m in ms if "april" in m]
        if ap:
            kept = sum(a["kept_model_tokens"] for a in ap)
            row["april"] = {
                "off_policy_share": sum(a["off_policy_tokens"] for a in ap) / kept if kept else 0.0,
                "off_policy_share_after_first": _share(ap, [r.iteration for r in mine if "april" in r.stats]),
                "kept_groups_per_iteration": statistics.mean(a["kept_groups"] for a in ap),
                "carried_unfinished_per_iteration": statistics.mean(a["carried_unfinished"] for a in ap),
                "aborted_chunks_per_iteration": statistics.mean(a["aborted_chunks"] for a in ap),
                "max_age_iterations": max(a["max_age_iterations"] for a in ap),
                "kept_model_tokens_per_s": statistics.mean(
                    sum(r.stats["april"]["kept_model_tokens"] for r in mine if r.repeat == rep)
                    / sum(r.stats["wall_s"] for r in mine if r.repeat == rep) for rep in by_rep),
            }
        rows[cfg.name] = row
    return {"bench": "multiturn_compare", "settings": asdict(s), "machine": platform.platform(),
            "cpus": os.cpu_count(), "command": command_line(s), "configs": rows,
            "runs": [asdict(r) for r in runs]}


def _share(aps: list[dict], iterations: list[int]) -> float:
    """Off-policy share over the iterations after the first (the first has nothing to carry)."""
    pairs = [(a, it) for a, it in zip(aps, iterations) if it > 0]
    kept = sum(a["kept_model_tokens"] for a, _ in pairs)
    return sum(a["off_policy_tokens"] for a, _ in pairs) / kept if kept else 0.0


def command_line(s: MTSettings) -> str:
    base = MTSettings()
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in asdict(s).items() if v != getattr(base, k)]
    return " ".join(["python -m bench.multiturn_compare", *flags])


def markdown(result: dict) -> str:
    s = result["settings"]
    rows = result["configs"]
    lines = [
        f"`{result['command']}` (commit {result.get('commit', '?')}{', dirty' if result.get('dirty') else ''}; "
        f"calculator task, model `{s['model']}`, {s['groups']} groups x G={s['group_size']} per iteration, "
        f"{s['iterations']} iterations per configuration and repeat, {s['repeats']} repeats alternating, "
        f"{s['instances']} instances x 1 core, tool latency lognormal median {s['latency_median_s']} s "
        f"sigma {s['latency_sigma']}, Seer chunk {s['chunk_size']}, APRIL over-issue {s['over_issue']:.0%}; "
        f"{result.get('elapsed_s', 0):.0f} s in all)",
        "",
        "| configuration | model tok/s (min-max) | vs sticky | wall s / iteration | tail s (min-max) | idle | "
        "idle while tools run | history tokens / turn | cached / recomputed per turn | from the pool / turn | "
        "turns moved | off-policy share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        ap = r.get("april")
        off = f"{ap['off_policy_share']:.1%} (after it 0: {ap['off_policy_share_after_first']:.1%})" if ap else "0 (on-policy)"
        lines.append(
            f"| {r['label']} | {r['tokens_per_s']:.0f} ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}) | "
            f"{ratio} | {r['wall_s_per_iteration']:.2f} | {r['tail_s']:.2f} ({r['tail_s_min']:.2f}-{r['tail_s_max']:.2f}) | "
            f"{r['idle_fraction']:.0%} | {r['idle_while_tools_fraction']:.0%} | {r['history_tokens_per_turn']:.0f} | "
            f"{r['cached_tokens_per_turn']:.0f} / {r['recomputed_tokens_per_turn']:.0f} | "
            f"{r['pool_tokens_per_turn']:.0f} | {r['moved_turns_share']:.0%} | {off} |")
    ap = [(n, r["april"]) for n, r in rows.items() if "april" in r]
    if ap:
        lines += ["", "APRIL per iteration: " + "; ".join(
            f"{n}: kept {a['kept_groups_per_iteration']:.1f} groups, carried {a['carried_unfinished_per_iteration']:.1f} "
            f"unfinished trajectories, aborted {a['aborted_chunks_per_iteration']:.1f} turns in flight, kept model "
            f"tokens {a['kept_model_tokens_per_s']:.0f}/s, oldest kept token {a['max_age_iterations']} iterations old"
            for n, a in ap)]
    lines += ["", "Columns: model tok/s = the model's tokens (observations excluded) of every iteration over their "
              "wall time; tail = the time only the last 10% of trajectories ran; idle = instance time with none of "
              "our chunks; idle while tools run = instance time with none of our chunks while some tool call ran; "
              "history / cached / recomputed per turn = the first chunk of every turn after the first (its prompt is "
              "the history) and how much of it the instance found cached (its prefix cache or the pool); from the "
              "pool = vLLM's prompt_tokens_by_source{external_kv_transfer} over the iteration, per such turn; turns "
              "moved = such turns on another instance than the turn before."]
    return "\n".join(lines)


def write(s: MTSettings, configs, runs: list[MTRun], traces: dict, out: Path, elapsed_s: float,
          provenance: dict) -> dict:
    result = summarize(s, configs, runs)
    result.update(elapsed_s=elapsed_s, **provenance)
    (out / "multiturn_compare.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "multiturn_compare.md").write_text(markdown(result) + "\n")
    for name, trace in traces.items():
        write_trace(out / f"trace_{name}.json", trace)
    plot(result, {n: traces[n] for n in result["configs"] if n in traces}, out)
    return result


def render(out: Path) -> dict:
    """Rewrite the md and plots of `out/multiturn_compare.json` (and its traces) with this code."""
    old = json.loads((out / "multiturn_compare.json").read_text())
    s = MTSettings(**{k: v for k, v in old["settings"].items() if k in MTSettings.__dataclass_fields__})
    runs = [MTRun(**r) for r in old["runs"]]
    traces = {p.stem[len("trace_"):]: json.loads(p.read_text()) for p in out.glob("trace_*.json")}
    configs = [BY_NAME[n] for n in s.configs.split(",")]
    return write(s, configs, runs, traces, out, old.get("elapsed_s", 0.0),
                 {"commit": old.get("commit"), "dirty": old.get("dirty")})


def plot(result: dict, traces: dict[str, dict], out: Path) -> None:
    """throughput.png: bars with the spread over repeats; timeline.png: per configuration, each
    instance's turns (one lane per concurrent chunk) and, below them in grey, the tool waits of the
    trajectories whose last turn ran there."""
    from bench.harness.instances import throughput_bars

    throughput_bars(result["configs"], out / "throughput.png", "model tokens/s",
                    "multi-turn rollout (calculator task), per configuration",
                    lambda r: (f"{r['ratio']:.2f}x" if r["ratio"] else "") + f"\ntail {r['tail_s']:.1f}s", headroom=1.25)
    if traces:
        timeline_plot(traces, out / "timeline.png")


def timeline_plot(traces: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seer.watch.trace import DRIVER_PID, WAIT_TID

    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 2.6 * len(traces)), squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        evs = trace["traceEvents"]
        procs = {ev["pid"]: ev["args"]["name"] for ev in evs if ev["ph"] == "M" and ev["name"] == "process_name"}
        row, ticks, labels = 0, [], []
        for k, pid in enumerate(sorted(p for p in procs if p != DRIVER_PID)):
            tids = sorted({ev["tid"] for ev in evs if ev["ph"] == "X" and ev["pid"] == pid})
            turn_tids = [t for t in tids if t < WAIT_TID]
            wait_tids = [t for t in tids if t >= WAIT_TID]
            index = {t: row + j for j, t in enumerate(turn_tids)}
            index.update({t: row + len(turn_tids) + 1 + j for j, t in enumerate(wait_tids)})
            for ev in evs:
                if ev["ph"] == "X" and ev["pid"] == pid:
                    wait = ev.get("cat") == "tool_wait"
                    color = "0.75" if wait else ("black" if "migrated" in ev.get("cat", "") else colors[k % len(colors)])
                    ax.broken_barh([(ev["ts"] / 1e6, ev["dur"] / 1e6)], (index[ev["tid"]], 0.9), facecolors=color,
                                   linewidth=0)
            ticks += [row + len(turn_tids) / 2, row + len(turn_tids) + 1 + len(wait_tids) / 2]
            labels += [f"{procs[pid]} turns", f"{procs[pid]} tool waits"]
            row += len(turn_tids) + len(wait_tids) + 3
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.set_ylim(-1, row)
        md = trace.get("otherData", {})
        ax.set_title(f"{name} (iteration {md.get('iteration', '?')} of repeat 0): turns per instance lane "
                     "(black: moved), tool waits in grey under the instance of the trajectory's last turn", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the iteration started")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse(argv: list[str] | None) -> MTSettings:
    ap = argparse.ArgumentParser(prog="python -m bench.multiturn_compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    notes = field_comments(MTSettings)
    for f, v in asdict(MTSettings()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=parse_bool if isinstance(v, bool) else type(v), default=v,
                        help=notes[f].replace("%", "%%") + " (default: %(default)s)")
    return MTSettings(**vars(ap.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    from bench.harness.instances import run_command

    return run_command(argv, parse, run, markdown, render)


if __name__ == "__main__":
    raise SystemExit(main())
