"""What one gateway call costs the driver, without a model: `python -m bench.gateway_call_cost`

    python -m bench.gateway_call_cost                      # the numbers docs/agents-gateway.md quotes
    PYTHONPATH=OLD python bench/gateway_call_cost.py --label before   # the same on another checkout

The real gateway (its server, sessions and the scheduler driver) serves the calculator agent of the
gateway's tests (tests.gateway.agents_for_tests:calc_agent, an `openai`-client loop) for `--groups`
x `--group-size` sessions, on the tests' scripted engine in place of vLLM (it writes the
calculator's calls at once), so what is timed is the gateway and the agents' clients. Per
`agent.mode` (loop, process), repeats alternating: the iteration's wall time, the driver process's
CPU time and, in process mode, the agent processes' (the agent host's and its reaped sessions'),
each per call. One runner
per mode serves every iteration (as one serves a run), warmed by two untimed small iterations. With
`--profile`, one more loop-mode iteration under cProfile, its own time summed by package: where a
call's CPU goes; and the gateway's own parts with what they call (cumulative): what removing from
the gateway could at most save.

Writes <out>/gateway_call_cost.json and .md (default out: bench/results/agent_gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import os
import platform
import pstats
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENT = "tests.gateway.agents_for_tests:calc_agent"


def _agents_cpu(runner) -> float:
    """The agent host's CPU seconds and its reaped sessions' (process mode; 0 in loop mode)."""
    host = getattr(runner, "_host", None)
    if host is None:
        return 0.0
    try:
        fields = Path(f"/proc/{host.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def runner(mode: str, sessions: int):
    """One agent runner per mode for the whole bench, as a run has one (its agent host, in process
    mode, imports what the first sessions imported late: later sessions fork warm)."""
    from seer.rollout.agents import AgentConfig, AgentRunner, AgentSpec

    return AgentRunner(AgentSpec.parse(AGENT, 600.0, cfg=AgentConfig(mode=mode)), sessions)


async def iteration(runner, groups: int, group_size: int, chunk: int) -> dict:
    """One iteration of `groups` x `group_size` sessions through a fresh gateway (and `runner`)."""
    from seer.model.chat import EmbeddedChat
    from seer.rollout.base import RolloutContext, RolloutRequest
    from seer.rollout.gateway import Gateway, GatewayLimits, GatewayServer, gateway_rollout
    from seer.tasks.reward import RewardRunner
    from seer.types import SamplingParams
    from tests.gateway import test_gateway as t

    decode = lambda ids: t.TOK.decode(ids, skip_special_tokens=True)  # noqa: E731
    gw = Gateway(EmbeddedChat(t.TOK.eos_token), t.encode, lambda ids: t.TOK.decode(ids, skip_special_tokens=False),
                 decode, t.TOK.eos_token, "seer-policy", GatewayLimits(max_call_tokens=64, max_context_tokens=4096))
    server = GatewayServer(gw, "127.0.0.1")
    await server.start()
    mode = runner.spec.mode
    prompts = t.calc_prompts([20 + 3 * i for i in range(groups)])
    rewards = RewardRunner("seer.tasks.calculator:score")
    cpu0, kids0, t0 = time.process_time(), _agents_cpu(runner), time.perf_counter()
    try:
        ctx = RolloutContext([t.CalcEngine("e0"), t.CalcEngine("e1")], t.scheduler(chunk), rewards, decode=decode,
                             encode=t.encode, gateway=gw, agents=runner)
        batch = await gateway_rollout(ctx, RolloutRequest(0, prompts, group_size, SamplingParams(max_tokens=512)))
        wall = time.perf_counter() - t0
    finally:
        await server.close()
        rewards.close()
    cpu, kids = time.process_time() - cpu0, _agents_cpu(runner) - kids0
    calls = gw.counters["calls"]
    ok = sum(1 for s in batch.samples if s.reward == 1.0)
    return {"mode": mode, "calls": calls, "wall_s": wall, "driver_cpu_s": cpu, "agents_cpu_s": kids,
            "rewarded": ok, "samples": len(batch.samples), "in_process": gw.counters.get("in_process", 0)}


def by_package(stats: pstats.Stats, top: int = 14) -> list[tuple[str, float]]:
    """Own time summed by installed package (seer's by module; the standard library's and builtins
    apart), the largest first."""
    agg: collections.Counter = collections.Counter()
    for (fn, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        m = re.search(r"site-packages/([^/]+)", fn)
        if m:
            key = m.group(1).removesuffix(".py")
        elif "/seer/" in fn:
            key = "seer." + fn.split("/seer/", 1)[1].removesuffix(".py").replace("/", ".")
        elif "/tests/" in fn:
            key = "tests (the scripted engine, the agent)"
        elif fn == "~":
            key = "builtins (isinstance, hash, tokenizers, ssl, sockets, ...)"
        else:
            key = "python's standard library"
        agg[key] += tt
    total = sum(agg.values())
    return [(k, round(v / total, 4)) for k, v in agg.most_common(top)]


# The gateway's parts in a loop-mode call, by cProfile's cumulative time (a coroutine's counts only
# while it runs, not while it waits): the request path behind the in-process door, the session work
# per turn, the per-chunk cut, and the two pieces in them that a call pays twice or per request.
GATEWAY_PARTS = {
    "request path (in-process transport, Api.handle and all under it)": ("gateway/server.py", "handle_async_request"),
    "session work per turn (Gateway.on_turn_end: _take, _deliver)": ("gateway/core.py", "on_turn_end"),
    "per-chunk cut (GatewayTurns.cut)": ("gateway/core.py", "cut"),
    "rendering the conversation (ChatFormat.render, twice per call)": ("model/chat.py", "render"),
    "the key's HMAC (Gateway.session_of)": ("gateway/core.py", "session_of"),
}


def gateway_parts(stats: pstats.Stats) -> list[tuple[str, float]]:
    """Each of GATEWAY_PARTS' cumulative time as a share of the profile's total own time."""
    total = sum(v[2] for v in stats.stats.values())
    out = []
    for label, (path, name) in GATEWAY_PARTS.items():
        ct = sum(v[3] for (fn, _line, fname), v in stats.stats.items() if fn.endswith(path) and fname == name)
        out.append((label, round(ct / total, 4)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8, help="prompts (default: 8)")
    ap.add_argument("--group-size", type=int, default=8, help="sessions per prompt (default: 8)")
    ap.add_argument("--chunk", type=int, default=64, help="tokens per chunk (default: 64)")
    ap.add_argument("--repeats", type=int, default=2, help="iterations per mode, alternating (default: 2)")
    ap.add_argument("--profile", action="store_true", help="one more loop-mode iteration under cProfile")
    ap.add_argument("--label", default="", help="a name for this checkout's rows (default: its commit)")
    ap.add_argument("--out", default="bench/results/agent_gateway", help="where the json and md go")
    a = ap.parse_args(argv)
    import seer

    code = Path(seer.__file__).resolve().parents[1]  # the checkout whose seer runs (PYTHONPATH decides)
    commit = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    label = a.label or commit
    runners = {mode: runner(mode, a.groups * a.group_size) for mode in ("loop", "process")}
    for r in runners.values():  # untimed: imports, the tokenizer, the agent host's start and warming
        for _ in range(2):
            asyncio.run(iteration(r, 2, 2, a.chunk))
    rows = []
    for rep in range(a.repeats):
        for mode in (("loop", "process") if rep % 2 == 0 else ("process", "loop")):
            r = asyncio.run(iteration(runners[mode], a.groups, a.group_size, a.chunk))
            r["repeat"] = rep
            rows.append(r)
            print(f"{mode:8s} {r['calls']} calls  wall {1e3 * r['wall_s'] / r['calls']:.2f} ms/call  driver cpu "
                  f"{1e3 * r['driver_cpu_s'] / r['calls']:.2f}  agents cpu {1e3 * r['agents_cpu_s'] / r['calls']:.2f}",
                  flush=True)
    profile = parts = None
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        asyncio.run(iteration(runners["loop"], a.groups, a.group_size, a.chunk))
        prof.disable()
        stats = pstats.Stats(prof)
        profile, parts = by_package(stats), gateway_parts(stats)
    for r in runners.values():
        asyncio.run(r.close())
    summary = {}
    for mode in ("loop", "process"):
        mine = [r for r in rows if r["mode"] == mode]
        calls = sum(r["calls"] for r in mine)
        summary[mode] = {k: round(1e3 * sum(r[k] for r in mine) / calls, 3) for k in ("wall_s", "driver_cpu_s",
                                                                                      "agents_cpu_s")}
        summary[mode]["calls_per_iteration"] = calls / len(mine)
        summary[mode]["in_process_share"] = round(sum(r["in_process"] for r in mine) / calls, 3)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gateway_call_cost.json"
    old = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    old["runs"][label] = {"command": "python -m bench.gateway_call_cost " + " ".join(argv or sys.argv[1:]),
                          "commit": commit, "code": str(code), "machine": platform.platform(), "cpus": os.cpu_count(),
                          "load_average": os.getloadavg(), "summary": summary, "profile": profile, "gateway_parts": parts,
                          "rows": rows}
    path.write_text(json.dumps(old, indent=1) + "\n")
    (out / "gateway_call_cost.md").write_text(markdown(old) + "\n")
    return 0


def markdown(result: dict) -> str:
    lines = ["What one gateway call costs without a model (`python -m bench.gateway_call_cost`: the real gateway "
             "and scheduler driver, the tests' scripted engine, the tests' `openai`-client calculator agent; "
             "milliseconds per call, summed over the iterations of each mode).", "",
             "| code | agent.mode | calls / iteration | wall ms / call | driver CPU ms / call | agent processes' CPU ms / call | "
             "calls in-process | load average |", "|---|---|---|---|---|---|---|---|"]
    for label, run in result["runs"].items():
        for mode, s in run["summary"].items():
            lines.append(f"| {label} (`{run['command']}`) | {mode} | {s['calls_per_iteration']:.0f} | {s['wall_s']:.2f} | "
                         f"{s['driver_cpu_s']:.2f} | {s['agents_cpu_s']:.2f} | {100 * s['in_process_share']:.0f}% | "
                         f"{run['load_average'][0]:.1f} |")
    for label, run in result["runs"].items():
        if run.get("profile"):
            lines += ["", f"Where the driver's CPU goes with the agents on its loop ({label}; cProfile own time by "
                      "package): " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in run["profile"]) + "."]
        if run.get("gateway_parts"):
            lines += ["", f"The gateway's own parts in that profile ({label}; cumulative: each with what it calls, "
                      "a share of the driver's CPU): " + "; ".join(f"{k} {100 * v:.1f}%" for k, v in run["gateway_parts"])
                      + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # run by path on another checkout: that checkout's seer comes first
    raise SystemExit(main())
