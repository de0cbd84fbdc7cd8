"""What containing an agent costs: `agent.mode: process` against `loop`, per session. `python -m bench.agent_runner_cost`

    python -m bench.agent_runner_cost                       # the numbers docs/agents.md quotes
    python -m bench.agent_runner_cost --sessions 16 --repeats 1   # a quick look

The calculator agent (seer.tasks.agents.calculator_openai, no tool latency) plays sessions against
a stand-in OpenAI server in a process of its own (bench.harness.openai_standin: the "model" answers
by rule at once, so what is timed is the agent side: the runner, the agent's process, the openai
client). Each repeat runs `--sessions` sessions once one at a time and once `--concurrent` at a
time, in each mode, the modes alternating within the repeat; the first session of each mode's
runner is its warm-up (the host's start and its imports) and is reported apart. Per session:
wall time as the runner sees it and the agent function's own time (medians; the difference is
the runner's part), and in process mode the session process's own memory (USS: private pages;
PSS: its share of those it shares with the host), read by the agent itself as it ends.

Writes bench/results/agent_gateway/runner_cost.json and .md.
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

from bench.harness.provenance import code_version
from bench.harness.openai_standin import MODEL, serve_in_process
from seer.rollout.agents import AgentConfig, AgentRunner, AgentSession, AgentSpec
from seer.tasks.agents.calculator_openai import agent as calculator_agent
from seer.tasks.calculator import CalcTaskConfig, generate_problems

OUT = Path("bench/results/agent_gateway")
AGENT = "bench.agent_runner_cost:agent"


def _memory_kib() -> dict[str, int]:
    """This process's USS and PSS in KiB (/proc/self/smaps_rollup)."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss", "Private_Clean", "Private_Dirty"):
            fields[name] = int(rest.split()[0])
    return {"uss_kib": fields["Private_Clean"] + fields["Private_Dirty"], "pss_kib": fields["Pss"]}


async def agent(base_url: str, api_key: str, session_id: str, record: dict, model: str | None = None) -> float:
    """The calculator agent; then its own time and its process's memory, written where the record says."""
    t0 = time.monotonic()
    reward = await calculator_agent(base_url=base_url, api_key=api_key, session_id=session_id, record=record,
                                    model=model, latency_median_s=0.0)
    if record.get("memory_out"):
        Path(record["memory_out"]).write_text(json.dumps({"agent_s": time.monotonic() - t0, **_memory_kib()}))
    return reward


async def _run(mode: str, base_url: str, keys: list[str], records: list[dict], concurrent: int,
               tmp: Path) -> dict:
    runner = AgentRunner(AgentSpec.parse(AGENT, 300.0, cfg=AgentConfig(mode=mode)), max_concurrent=concurrent)
    try:
        t0 = time.monotonic()
        warm = await runner.run(AgentSession("warm", base_url, keys[0], records[0], MODEL))
        warm_s = time.monotonic() - t0
        sessions = [AgentSession(f"s{i}", base_url, keys[i + 1], {**r, "memory_out": str(tmp / f"{mode}-{i}.json")},
                                 MODEL) for i, r in enumerate(records[1:])]
        t0 = time.monotonic()
        outs = await asyncio.gather(*map(runner.run, sessions))
        total_s = time.monotonic() - t0
    finally:
        await runner.close()
    errors = [o.error for o in outs if o.error]
    memory = [json.loads((tmp / f"{mode}-{i}.json").read_text()) for i in range(len(sessions))
              if (tmp / f"{mode}-{i}.json").exists()]
    return {"mode": mode, "concurrent": concurrent, "sessions": len(sessions), "warm_up_s": round(warm_s, 3),
            "total_s": round(total_s, 3), "session_wall_median_s": round(statistics.median(o.wall_s for o in outs), 4),
            "agent_own_median_s": round(statistics.median(m["agent_s"] for m in memory), 4) if memory else None,
            "errors": errors, "rewards_mean": statistics.mean(o.reward or 0.0 for o in outs),
            "uss_median_kib": statistics.median(m["uss_kib"] for m in memory) if mode == "process" and memory else None,
            "pss_median_kib": statistics.median(m["pss_kib"] for m in memory) if mode == "process" and memory else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=32, help="sessions per measurement (after the warm-up one)")
    ap.add_argument("--concurrent", type=int, default=8, help="sessions at once in the concurrent measurement")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every measurement, the modes alternating")
    ap.add_argument("--out", type=Path, default=OUT, help="where runner_cost.json and .md go")
    args = ap.parse_args(argv)
    problems = generate_problems(CalcTaskConfig(num_prompts=args.sessions + 1, seed=11))
    records = [{"prompt": p.text, "reference": p.reference} for p in problems]
    runs = []
    tmp = args.out / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for repeat in range(args.repeats):
        for concurrent in (1, args.concurrent):
            modes = ("loop", "process") if repeat % 2 == 0 else ("process", "loop")  # alternating
            for mode in modes:
                keys = [f"sk-{repeat}-{concurrent}-{mode}-{i}" for i in range(len(records))]
                base_url, stop = serve_in_process({k: k for k in keys})
                try:
                    r = asyncio.run(_run(mode, base_url, keys, records, concurrent, tmp))
                finally:
                    stop()
                r["repeat"] = repeat
                runs.append(r)
                print(json.dumps(r), flush=True)
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    summary = {}
    for concurrent in (1, args.concurrent):
        by = {m: [r for r in runs if r["mode"] == m and r["concurrent"] == concurrent] for m in ("loop", "process")}
        med = {m: statistics.median(r["session_wall_median_s"] for r in rs) for m, rs in by.items()}
        tot = {m: statistics.median(r["total_s"] for r in rs) for m, rs in by.items()}
        own = {m: statistics.median(r["agent_own_median_s"] for r in rs) for m, rs in by.items()}
        summary[f"concurrent_{concurrent}"] = {
            "session_wall_median_s": med, "agent_own_median_s": own, "total_s_median": tot,
            "process_minus_loop_per_session_s": round(med["process"] - med["loop"], 4),
            "process_over_loop_total": round(tot["process"] / tot["loop"], 3)}
    warm = {m: statistics.median(r["warm_up_s"] for r in runs if r["mode"] == m) for m in ("loop", "process")}
    mem = [r for r in runs if r["uss_median_kib"] is not None]
    commit, dirty = code_version()
    command = " ".join(["python -m bench.agent_runner_cost", *(sys.argv[1:] if argv is None else argv)])
    result = {"command": command, "args": vars(args) | {"out": str(args.out)}, "commit": commit, "uncommitted_changes": dirty,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load_average": os.getloadavg(), "summary": summary, "warm_up_s_median": warm,
              "process_session_uss_kib_median": statistics.median(r["uss_median_kib"] for r in mem) if mem else None,
              "process_session_pss_kib_median": statistics.median(r["pss_median_kib"] for r in mem) if mem else None,
              "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runner_cost.json").write_text(json.dumps(result, indent=1))
    lines = ["# What containing an agent costs (bench.agent_runner_cost)", "", f"`{command}`", "",
             "| sessions at once | loop: session wall (agent's own) | process: session wall (agent's own) | "
             "process - loop | process / loop, all sessions' wall |", "|---|---|---|---|---|"]
    for key, s in summary.items():
        own = s["agent_own_median_s"]
        lines.append(f"| {key.split('_')[1]} | {s['session_wall_median_s']['loop']:.3f} s ({own['loop']:.3f} s) | "
                     f"{s['session_wall_median_s']['process']:.3f} s ({own['process']:.3f} s) | "
                     f"{s['process_minus_loop_per_session_s']:+.3f} s | {s['process_over_loop_total']:.2f}x |")
    lines += ["", f"Warm-up session (the runner's first: the host's start and imports in process mode): loop "
              f"{warm['loop']:.2f} s, process {warm['process']:.2f} s.",
              f"A process-mode session's own memory at its end: USS {result['process_session_uss_kib_median'] or 0:.0f} KiB, "
              f"PSS {result['process_session_pss_kib_median'] or 0:.0f} KiB (medians).",
              f"Load average at the end: {', '.join(f'{x:.1f}' for x in result['load_average'])}."]
    (args.out / "runner_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
