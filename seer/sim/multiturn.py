"""Multi-turn rollout at cluster scale, by simulation (`python -m bench.sim.multiturn` runs it).

The real comparison (bench.multiturn_compare) runs on two CPU cores; this shows the cluster-scale
picture of the same question, session-sticky routing (verl, slime) against Seer's turns on divided
rollout over a KV pool, with the production scheduler (the real Dispatcher, policies and turn
handling, seer.scheduler) and modelled engines (seer.sim.instance, priced by the roofline of the
paper's Moonlight deployment on H800s, seer.sim.hardware).

The workload (`AgentWorkload`): trajectories of heavy-tailed turn counts (lognormal, correlated
within a group: every sample of a prompt faces the same task), each turn's model tokens
lognormal, each tool call's observation lognormal (the context grows by it every turn) and its
latency lognormal (seconds: a sandbox or a web tool). Every configuration replays the same scripts
(seer.sim.scripts). Prefix reuse is modelled per instance: a turn that runs where its history
last ran computes only the new observation; one that moves loads the history from the pool (Seer)
at the measured pool-vs-prefill cost, or without a pool recomputes it. Engines keep every prefix
they computed (no eviction), which favours sticky routing: real engines under memory pressure
evict and recompute.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from dataclasses import dataclass, replace

from seer.rollout.divided import stats_from_result
from seer.scheduler import SchedulerConfig
from seer.scheduler.decisions import Wait
from seer.scheduler.dispatcher import Dispatcher, RolloutError
from seer.scheduler.driver import RolloutResult
from seer.scheduler.events import EnvWait
from seer.scheduler.turns import StopMatcher, TurnReply
from seer.sim.instance import SimSeq
from seer.sim.scripts import Script, continuation_prefix, idle_while_tools
from seer.sim.simulate import SimSettings, make_instances
from seer.sim.workloads import PAPER_WORKLOADS, Workload
from seer.types import GenerateResult, PromptSpec, SamplingParams

STICKY = "seer.scheduler.policies.sticky:SessionSticky"


@dataclass(frozen=True)
class AgentWorkload:
    """An agentic RL iteration on the paper's Moonlight deployment (one H800 per instance)."""

    base: str = "moonlight"  # the paper workload whose model, GPUs, KV and batch limits the instances have
    instances: int = 32
    groups: int = 400  # the paper's Moonlight batch (Table 3): 3,200 trajectories on 32 instances
    group_size: int = 8
    median_turns: float = 8.0  # lognormal turns per trajectory
    turns_sigma: float = 0.9
    turns_icc: float = 0.8  # share of the log-variance of turns shared by a group's samples
    max_turns: int = 64
    turn_tokens: float = 300.0  # lognormal median of a turn's model tokens
    turn_sigma: float = 0.8
    obs_tokens: float = 400.0  # lognormal median of an observation's tokens (context growth per turn)
    obs_sigma: float = 1.0
    tool_latency_s: float = 2.0  # lognormal median of a tool call
    tool_sigma: float = 1.0
    prompt_tokens: int = 1024
    max_tokens: int = 65536  # a trajectory's budget (turns and observations)
    # Seer's chunk: about a few turns, so that a chunk's KV reservation (its context + the chunk) does
    # not hold back admission (the paper's 8192 reserves 27x a median turn; bench.sim.multiturn --set
    # chunk_size=<the paper's 8192> --tag c8k shows what that costs)
    chunk_size: int = 1024
    token_unit: int = 16  # real tokens per simulated token

    def workload(self) -> Workload:
        return replace(PAPER_WORKLOADS[self.base], instances=self.instances, groups=self.groups,
                       group_size=self.group_size, max_tokens=self.max_tokens, prompt_tokens=self.prompt_tokens,
                       chunk_size=self.chunk_size, token_unit=self.token_unit)

    def scripts(self, seed: int) -> dict[tuple[int, int], Script]:
        """Every trajectory's script, in simulator units (turns >= 1 unit, observations >= 0)."""
        rng = random.Random(f"agent-workload:{seed}")
        u = self.token_unit
        shared, own = self.turns_sigma * math.sqrt(self.turns_icc), self.turns_sigma * math.sqrt(1 - self.turns_icc)
        out = {}
        for g in range(self.groups):
            mu = math.log(self.median_turns) + rng.gauss(0, shared)
            for k in range(self.group_size):
                n = max(1, min(self.max_turns, round(math.exp(mu + rng.gauss(0, own)))))
                turns, obs, lat = [], [()], [0.0]
                budget = (self.max_tokens - self.prompt_tokens) // u
                for t in range(n):
                    turns.append(max(1, round(rng.lognormvariate(math.log(self.turn_tokens), self.turn_sigma) / u)))
                    budget -= turns[-1]
                    if t < n - 1:
                        o = round(rng.lognormvariate(math.log(self.obs_tokens), self.obs_sigma) / u)
                        if budget - o < 2:
                            break
                        obs.append((0,) * o)
                        lat.append(rng.lognormvariate(math.log(self.tool_latency_s), self.tool_sigma))
                        budget -= o
                out[(g, k)] = Script(tuple(turns), tuple(obs[:len(turns)]), tuple(lat[:len(turns)]))
        return out


@dataclass(frozen=True)
class SimConfig:
    name: str
    label: str
    policy: str
    chunked: bool
    pooled: bool
    turn_tokens: int = 0  # context policy: a turn boundary priced in (real) tokens


CONFIGS = (
    SimConfig("sticky", "session-sticky + prefix cache (verl, slime)", STICKY, chunked=False, pooled=False),
    SimConfig("seer", "Seer: divided turns on the KV pool, context-aware", "context", chunked=True, pooled=True),
    SimConfig("oracle", "oracle longest-first on the KV pool", "oracle_lfs", chunked=True, pooled=True),
)


def simulate_multiturn(aw: AgentWorkload, cfg: SimConfig, scripts: dict, settings: SimSettings) -> dict:
    """One iteration of `aw`'s trajectories under `cfg`, on virtual time: the numbers the real
    comparison reports (tokens/s, tail, idle while tools run, prefix per continuation turn)."""
    t0 = time.perf_counter()
    w = aw.workload()
    u = w.token_unit
    cap = max(1, w.kv_capacity_tokens // u)
    max_units = w.max_tokens // u
    sched = SchedulerConfig(policy=cfg.policy, chunk_size=max(1, w.chunk_size // u) if cfg.chunked else max_units,
                            policy_args={"turn_tokens": cfg.turn_tokens // u} if cfg.turn_tokens else {},
                            block_size=1, affinity_gap_tokens=max(1, 512 // u), kv_capacity_tokens=cap,
                            max_running=w.max_num_seqs, kv_pool=cfg.pooled)
    policy = sched.build_policy({k: s.response_tokens for k, s in scripts.items()}
                                if cfg.policy == "oracle_lfs" else None)
    prompt = [7] * max(1, w.prompt_tokens // u)
    prompts = [PromptSpec(g, f"g{g}", prompt, {}) for g in range(w.groups)]
    names = [f"inst{i}" for i in range(w.instances)]
    disp = Dispatcher(prompts, w.group_size, SamplingParams(max_tokens=max_units), policy, names,
                      kv_capacity_tokens=cap, turns=StopMatcher((), lambda ids: ""))
    insts = make_instances(w, settings, names, cap)
    cached: dict[str, dict[str, int]] = {}  # request -> instance -> context units whose KV it holds
    heap: list[tuple[float, int, str]] = []
    env_heap: list[tuple[float, int, object]] = []
    version = {n: 0 for n in names}
    waits: list[EnvWait] = []
    prefilled: dict[str, int] = {}  # chunk id -> prompt units it computes (not cached, not loaded)
    pool_units = 0

    def schedule(name: str) -> None:
        version[name] += 1
        t = insts[name].next_event()
        if t < math.inf:
            heapq.heappush(heap, (t, version[name], name))

    now, n_env = 0.0, 0
    while not disp.done:
        for end in disp.take_turn_ends():
            sc = scripts[(end.request.group_id, end.request.sample_index)]
            delay = sc.latency_s[end.turn] if end.reason != "length" and end.turn < len(sc.turns) else 0.0
            n_env += 1
            heapq.heappush(env_heap, (now + delay, n_env, (end, now)))
        touched = set()
        while not isinstance(d := disp.next_decision(), Wait):
            ticket = disp.start(d, now)
            req = ticket.request
            sc = scripts[(req.group_id, req.sample_index)]
            context = len(ticket.generate.prompt_ids)
            left = sc.turn_left(req.generated)
            goal = max(1, min(ticket.max_tokens, left))
            mine = cached.setdefault(req.request_id, {})
            here = mine.get(ticket.instance, 0)
            elsewhere = max(mine.values(), default=0) if ticket.migrated and cfg.pooled else 0  # in the pool
            moved = elsewhere > here
            hit = elsewhere if moved else here
            pool_units += (elsewhere - here) if moved else 0
            seq = SimSeq(ticket, float(context), goal, goal >= left, 0.0, float(context - hit),
                         probe=req.sample_index == 0, migrated=moved)
            prefilled[ticket.generate.request_id] = context - hit
            insts[ticket.instance].submit(seq, now)
            touched.add(ticket.instance)
        for name in touched:
            schedule(name)
        while heap and heap[0][1] != version[heap[0][2]]:
            heapq.heappop(heap)
        t_inst = heap[0][0] if heap else math.inf
        t_env = env_heap[0][0] if env_heap else math.inf
        if t_inst == math.inf and t_env == math.inf:
            raise RolloutError(f"simulation stalled with {len(disp.buffer) - disp.buffer.num_finished} requests left")
        if t_env <= t_inst:
            now, _, (end, began) = heapq.heappop(env_heap)
            r = end.request
            sc = scripts[(r.group_id, r.sample_index)]
            done = end.reason == "length" or end.turn >= len(sc.turns)
            waits.append(EnvWait(r.request_id, r.group_id, r.sample_index, end.turn, r.last_instance, began, now))
            disp.resume(end, TurnReply(done=True) if done else TurnReply(sc.obs[end.turn]), now)
            continue
        now, _, name = heapq.heappop(heap)
        for seq in insts[name].on_event(now):
            t = seq.ticket
            n = int(round(seq.made))
            context = len(t.generate.prompt_ids)
            hit = context - prefilled.pop(t.generate.request_id)
            disp.complete(t, GenerateResult(t.generate.request_id, [0] * n, [], "stop" if seq.stops else "length",
                                            hit, context, name, now, now), now)
            cached[t.request.request_id][name] = context + n - 1
        schedule(name)
    result = RolloutResult(policy.name, sorted(disp.samples, key=lambda s: (s.group_id, s.sample_index)),
                           list(disp.events), [], 0.0, now, policy.summary(), env_waits=waits)
    stats = stats_from_result(result, 0, names, finish_times=[s.finish_time for s in result.samples])
    model_units = sum(c.new_tokens for c in result.chunks)
    idle = idle_while_tools(result.chunks, waits, names, 0.0, now)
    cont = continuation_prefix(result.chunks)
    turns = cont["turns"] or 1
    return {
        "label": cfg.label, "wall_s": now, "tokens_per_s": model_units * u / now, "tail_s": stats.tail_s,
        "idle_fraction": statistics.mean(i.idle_fraction for i in stats.instances),
        "idle_while_tools_fraction": sum(idle.values()) / (now * len(names)),
        "history_tokens_per_turn": cont["history_tokens"] * u / turns,
        "recomputed_tokens_per_turn": cont["recomputed_tokens"] * u / turns,
        "pool_tokens_per_turn": pool_units * u / turns, "moved_turns_share": cont["moved_turns"] / turns,
        "preemptions": stats.preemptions, "sim_seconds": time.perf_counter() - t0,
    }
