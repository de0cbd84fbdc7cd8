"""What a command agent's start costs per session, and what `agent.serve` saves. `python -m bench.agent_command_cost`

    python -m bench.agent_command_cost                      # the numbers docs/agents.md quotes
    python -m bench.agent_command_cost --sessions 8 --repeats 1   # a quick look

The calculator as a program (seer.tasks.agents.calculator_command, no tool latency, the synchronous
`openai` client) plays sessions against a stand-in OpenAI server in a process of its own
(bench.harness.openai_standin: the "model" answers by rule at once, so what is timed is the agent's
side). Two ways: `command`, a fresh interpreter per session (its start and its imports each time),
and `serve` (`agent.serve: true`, `--serve`), one process serving every session from threads. Each
repeat runs `--sessions` sessions one at a time and `--concurrent` at a time in both ways, the ways
alternating; for `serve` the process's start is paid by the first session of each runner, which is
reported apart (warm-up) and not counted in the medians and totals.

Writes bench/results/agent_gateway/command_cost.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.harness.openai_standin import MODEL, serve_in_process
from bench.harness.provenance import code_version
from seer.rollout.agents import AgentConfig, AgentRunner, AgentSession, AgentSpec
from seer.tasks.calculator import CalcTaskConfig, generate_problems

OUT = Path("bench/results/agent_gateway")
COMMAND = f"{sys.executable} -m seer.tasks.agents.calculator_command --latency-median-s 0"
WAYS = ("command", "serve")


async def _run(way: str, base_url: str, keys: list[str], records: list[dict], concurrent: int) -> dict:
    cfg = AgentConfig(timeout_s=300.0, serve=way == "serve")
    target = COMMAND + (" --serve" if way == "serve" else "")
    runner = AgentRunner(AgentSpec.parse(target, 300.0, cfg=cfg), max_concurrent=concurrent)
    try:
        t0 = time.monotonic()
        warm = await runner.run(AgentSession("warm", base_url, keys[0], records[0], MODEL))
        warm_s = time.monotonic() - t0
        sessions = [AgentSession(f"s{i}", base_url, keys[i + 1], r, MODEL) for i, r in enumerate(records[1:])]
        t0 = time.monotonic()
        outs = await asyncio.gather(*map(runner.run, sessions))
        total_s = time.monotonic() - t0
    finally:
        await runner.close()
    return {"way": way, "concurrent": concurrent, "sessions": len(sessions), "warm_up_s": round(warm_s, 3),
            "warm_up_error": warm.error, "total_s": round(total_s, 3),
            "session_wall_median_s": round(statistics.median(o.wall_s for o in outs), 4),
            "errors": [o.error for o in outs if o.error], "rewards_mean": statistics.mean(o.reward or 0.0 for o in outs)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=16, help="sessions per measurement (after the warm-up one)")
    ap.add_argument("--concurrent", type=int, default=8, help="sessions at once in the concurrent measurement")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every measurement, the ways alternating")
    ap.add_argument("--out", type=Path, default=OUT, help="where command_cost.json and .md go")
    args = ap.parse_args(argv)
    problems = generate_problems(CalcTaskConfig(num_prompts=args.sessions + 1, seed=11))
    records = [{"prompt": p.text, "reference": p.reference} for p in problems]
    runs = []
    for repeat in range(args.repeats):
        for concurrent in (1, args.concurrent):
            for way in (WAYS if repeat % 2 == 0 else WAYS[::-1]):
                keys = [f"sk-{repeat}-{concurrent}-{way}-{i}" for i in range(len(records))]
                base_url, stop = serve_in_process({k: k for k in keys})
                try:
                    r = asyncio.run(_run(way, base_url, keys, records, concurrent))
                finally:
                    stop()
                r["repeat"] = repeat
                runs.append(r)
                print(json.dumps(r), flush=True)
    summary = {}
    for concurrent in (1, args.concurrent):
        by = {w: [r for r in runs if r["way"] == w and r["concurrent"] == concurrent] for w in WAYS}
        wall = {w: statistics.median(r["session_wall_median_s"] for r in rs) for w, rs in by.items()}
        tot = {w: statistics.median(r["total_s"] for r in rs) for w, rs in by.items()}
        summary[f"concurrent_{concurrent}"] = {
            "session_wall_median_s": wall, "total_s_median": tot,
            "command_minus_serve_per_session_s": round(wall["command"] - wall["serve"], 4),
            "command_over_serve_total": round(tot["command"] / tot["serve"], 2)}
    warm = {w: statistics.median(r["warm_up_s"] for r in runs if r["way"] == w) for w in WAYS}
    commit, dirty = code_version()
    command = " ".join(["python -m bench.agent_command_cost", *(sys.argv[1:] if argv is None else argv)])
    result = {"command": command, "args": vars(args) | {"out": str(args.out)}, "commit": commit,
              "uncommitted_changes": dirty, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load_average": os.getloadavg(), "cpus": os.cpu_count(), "summary": summary, "warm_up_s_median": warm,
              "errors": sum(len(r["errors"]) + bool(r["warm_up_error"]) for r in runs), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "command_cost.json").write_text(json.dumps(result, indent=1))
    lines = ["# What a command agent's start costs per session (bench.agent_command_cost)", "", f"`{command}`", "",
             "| sessions at once | command: session wall | serve: session wall | command - serve | "
             "command / serve, all sessions' wall |", "|---|---|---|---|---|"]
    for key, s in summary.items():
        w = s["session_wall_median_s"]
        lines.append(f"| {key.split('_')[1]} | {w['command']:.3f} s | {w['serve']:.3f} s | "
                     f"{s['command_minus_serve_per_session_s']:+.3f} s | {s['command_over_serve_total']:.2f}x |")
    lines += ["", f"First session of a runner (serve: the process's start and imports): command {warm['command']:.2f} s, "
              f"serve {warm['serve']:.2f} s (medians). Sessions with an error: {result['errors']}.",
              f"Commit {commit}{' (uncommitted changes)' if dirty else ''}, {result['date']}, {os.cpu_count()} CPUs, "
              f"load average at the end: {', '.join(f'{x:.1f}' for x in result['load_average'])}."]
    (args.out / "command_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
