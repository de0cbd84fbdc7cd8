"""Multi-turn rollout at cluster scale, by simulation: `python -m bench.sim.multiturn`.

Session-sticky routing (verl, slime) against Seer's turns on divided rollout over a KV pool, on the
paper's Moonlight deployment (seer.sim.multiturn says what is modelled). Writes
bench/results/sim/sim_multiturn.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from seer.sim.chunk_model import GPU_CLUSTER
from seer.sim.multiturn import CONFIGS, AgentWorkload, SimConfig, simulate_multiturn
from seer.sim.simulate import SimSettings
from seer.sim.speculation import AcceptanceTable
from seer.sim.step_model import load


def run(aw: AgentWorkload, seeds: list[int], settings: SimSettings, configs: Sequence[SimConfig] = CONFIGS) -> dict:
    per_seed = []
    for seed in seeds:
        scripts = aw.scripts(seed)
        per_seed.append({c.name: simulate_multiturn(aw, c, scripts, settings) for c in configs})
    rows = {}
    for c in configs:
        rs = [p[c.name] for p in per_seed]
        ratios = [p[c.name]["tokens_per_s"] / p["sticky"]["tokens_per_s"] for p in per_seed]
        rows[c.name] = {**{k: (statistics.mean(r[k] for r in rs) if isinstance(rs[0][k], (int, float)) else rs[0][k])
                           for k in rs[0]},
                        "ratio": statistics.mean(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    sc = aw.scripts(seeds[0])
    shape = {"trajectories": len(sc), "turns_median": statistics.median(len(s.turns) for s in sc.values()),
             "turns_max": max(len(s.turns) for s in sc.values()),
             "response_tokens_median": statistics.median(s.response_tokens for s in sc.values()) * aw.token_unit,
             "response_tokens_max": max(s.response_tokens for s in sc.values()) * aw.token_unit}
    return {"workload": asdict(aw), "shape": shape, "seeds": seeds, "configs": rows}


def markdown(result: dict, command: str) -> str:
    w, sh = result["workload"], result["shape"]
    lines = [
        f"`{command}`", "",
        f"{w['instances']} instances of the paper's {w['base']} deployment (roofline step model), {w['groups']} groups "
        f"x G={w['group_size']} = {sh['trajectories']} trajectories; turns lognormal median {w['median_turns']:g} "
        f"(sigma {w['turns_sigma']:g}, group share {w['turns_icc']:.0%}; median {sh['turns_median']:g}, max "
        f"{sh['turns_max']}), {w['turn_tokens']:g} model tokens per turn and {w['obs_tokens']:g} observation tokens "
        f"per tool call (lognormal medians), tool latency lognormal median {w['tool_latency_s']:g} s sigma "
        f"{w['tool_sigma']:g}; trajectories median {sh['response_tokens_median']:.0f} max "
        f"{sh['response_tokens_max']:.0f} tokens; seeds {result['seeds']}.", "",
        "| configuration | throughput vs sticky (min-max) | wall s | tail s | idle | idle while tools run | "
        "history tokens / turn | recomputed / turn | from the pool / turn | turns moved | preemptions |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["configs"].values():
        lines.append(
            f"| {r['label']} | {r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {r['wall_s']:.0f} | "
            f"{r['tail_s']:.0f} | {r['idle_fraction']:.0%} | {r['idle_while_tools_fraction']:.0%} | "
            f"{r['history_tokens_per_turn']:.0f} | {r['recomputed_tokens_per_turn']:.0f} | "
            f"{r['pool_tokens_per_turn']:.0f} | {r['moved_turns_share']:.0%} | {r['preemptions']:.0f} |")
    lines += ["", f"Simulated in {sum(r['sim_seconds'] for r in result['configs'].values()):.0f} s. Engines keep "
              "every prefix they computed (no eviction), which favours sticky routing."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim.multiturn", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds; each draws the trajectories anew")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="an AgentWorkload field (instances=16, tool_latency_s=0.1, ...); needs --tag")
    ap.add_argument("--turn-tokens", type=int, default=0,
                    help="also Seer with turns in its group estimate, each priced at this many tokens; needs --tag")
    ap.add_argument("--tag", default=None, help="write sim_multiturn_TAG.* instead")
    ap.add_argument("--out", default="bench/results/sim", help="directory for the results' JSON and markdown")
    args = ap.parse_args(argv)
    fields = AgentWorkload.__dataclass_fields__
    over = {}
    for item in args.set:
        k, _, v = item.partition("=")
        if k not in fields or not v:
            ap.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {sorted(fields)}")
        over[k] = type(getattr(AgentWorkload(), k))(v)
    if (over or args.turn_tokens) and not args.tag:
        ap.error("--set and --turn-tokens change the run: give it a --tag so it does not overwrite the recorded results")
    configs = list(CONFIGS)
    if args.turn_tokens:
        configs.insert(2, SimConfig("seer_turns", f"Seer, a turn priced at {args.turn_tokens} tokens in the estimate",
                                    "context", chunked=True, pooled=True, turn_tokens=args.turn_tokens))
    aw = AgentWorkload(**over)
    settings = SimSettings(step=load().model, acceptance=AcceptanceTable.paper(), roofline=True, chunk_cost=GPU_CLUSTER)
    command = " ".join(["python -m bench.sim.multiturn", *(sys.argv[1:] if argv is None else argv)])
    result = run(aw, [int(s) for s in args.seeds.split(",")], settings, configs)
    result["command"] = command
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "sim_multiturn" + (f"_{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(result, command) + "\n")
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
