"""Grouped drafting on multi-turn trajectories, offline: are observations worth a place in the tree?

    python -m bench.dgds_multiturn [--prompts 16] [--group-size 8] [--max-tokens 640]

1. Trajectories: the calculator task's own model (`calc`) against the real calculator environment,
   one vLLM instance, multi-turn rollout at temperature 1.0 (bench.multiturn_compare's warm-up),
   cached under ~/.cache/seer/bench/ so reruns skip generation.
2. For each trajectory, the drafter sees the group's suffix tree with n complete siblings (n = 0
   and G-1) plus the prompt and its own turns so far, a sequence per turn (the proposer's sequence
   per chunk), and drafts at every model token from its own context (observations included: the
   engine's tokens). Two trees: the model's tokens only (what Seer's proposer appends: an
   observation reaches an engine inside the next turn's prompt, which the proposer does not
   append) and each turn's sequence led by the observation before it. A draft is checked against
   the rest of its turn; each step also emits the bonus token (as the paper's Table 2 counts).

Writes bench/results/dgds_multiturn/dgds_multiturn.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from pathlib import Path

from bench.harness.dgds_acceptance_sim import merge, replay, turns_accepted_at
from bench.harness.provenance import code_version
from seer.dgds.types import DraftParams

TREES = {"model tokens only (Seer's proposer)": False, "with the observations": True}


def trajectories(model: str, n_prompts: int, group_size: int, max_tokens: int, seed: int, cache: Path) -> dict:
    """{"prompts": [[ids]], "groups": [[{"ids": [...], "mask": [...]}]]}: one multi-turn rollout, cached."""
    if cache.exists():
        return json.loads(cache.read_text())
    from seer.fleet.pool import InstancePool
    from seer.model import ensure_model
    from seer.procs import cpu_sets

    from bench.harness.instances import instance_specs
    from bench.multiturn_compare import MTSettings, _records, calculator_samples

    s = MTSettings(model=model, groups=n_prompts, group_size=group_size, max_tokens=max_tokens, seed=seed,
                   instances=1, max_num_seqs=max(64, n_prompts * group_size))
    model_dir = ensure_model(model, progress=False)
    prompts = _records(s, n_prompts, model_dir)
    print(f"generating {n_prompts}x{group_size} trajectories with vLLM (start-up takes a minute or two)", flush=True)
    with InstancePool.launch(instance_specs(s, model_dir, cpu_sets(1)), cache.parent / "logs") as pool:
        async def go():
            try:
                return await calculator_samples(pool.clients, s, prompts, model_dir, kv_pool=False)
            finally:
                await pool.aclose_clients()

        samples = asyncio.run(go())
    groups: list[list[dict]] = [[] for _ in prompts]
    for x in samples:
        groups[x.group_id].append({"ids": list(x.response_ids), "mask": list(x.loss_mask or [1] * len(x.response_ids))})
    data = {"prompts": [list(p.prompt_ids) for p in prompts], "groups": groups}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(data))
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="calc", help="embedded preset (calc: the calculator task's model)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts (groups) of the calculator task")
    ap.add_argument("--group-size", type=int, default=8, help="trajectories per prompt (G)")
    ap.add_argument("--max-tokens", type=int, default=640, help="a trajectory's budget (turns and observations)")
    ap.add_argument("--spec-tokens", type=int, default=8, help="gamma: tokens drafted per step")
    ap.add_argument("--seed", type=int, default=0, help="seeds the prompts and the sampling")
    ap.add_argument("--out", default="bench/results/dgds_multiturn", help="where the JSON and markdown go")
    args = ap.parse_args(argv)

    from seer.model import resolve_model

    key = hashlib.sha1(f"{resolve_model(args.model)}/{args.prompts}/{args.group_size}/{args.max_tokens}/{args.seed}"
                       .encode()).hexdigest()[:10]
    cache = Path.home() / ".cache" / "seer" / "bench" / f"dgds_multiturn-{key}.json"
    data = trajectories(args.model, args.prompts, args.group_size, args.max_tokens, args.seed, cache)
    G = args.group_size
    params = DraftParams(max_spec_tokens=args.spec_tokens, pattern_lookup_max=24)
    refs_list = sorted({0, G - 1})
    t0 = time.perf_counter()
    rows: dict[str, dict[int, float]] = {}
    for name, obs in TREES.items():
        rows[name] = {}
        for n in refs_list:
            results = []
            for gi, group in enumerate(data["groups"]):
                for ri, traj in enumerate(group):
                    siblings = [(group[(ri + j) % len(group)]["ids"], group[(ri + j) % len(group)]["mask"])
                                for j in range(1, len(group))]
                    for turn in turns_accepted_at(data["prompts"][gi], traj["ids"], traj["mask"], siblings[:n],
                                                  params, observations=obs):
                        results.append(replay(turn))
            rows[name][n] = round(merge(results).mean_acceptance_length, 3)
            print(f"{name}, {n} references: {rows[name][n]}", flush=True)
    trajs = [t for g in data["groups"] for t in g]
    model_tokens = sum(sum(t["mask"]) for t in trajs)
    obs_tokens = sum(len(t["mask"]) - sum(t["mask"]) for t in trajs)
    turns = sum(sum(1 for i, m in enumerate(t["mask"]) if m and (i == 0 or not t["mask"][i - 1])) for t in trajs)
    result = {
        "bench": "dgds_multiturn", "date": time.strftime("%Y-%m-%d"),
        **dict(zip(("commit", "dirty"), code_version())),
        "command": "python -m bench.dgds_multiturn" + "".join(
            f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items()
            if k != "out" and v != ap.get_default(k)),
        "model": args.model, "prompts": args.prompts, "group_size": G, "spec_tokens": args.spec_tokens,
        "trajectories": len(trajs), "turns": turns, "model_tokens": model_tokens, "observation_tokens": obs_tokens,
        "mean_acceptance_length": rows, "replay_s": round(time.perf_counter() - t0, 1),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dgds_multiturn.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Grouped drafting on multi-turn trajectories ({result['date']}, commit {result['commit']})", "",
             f"`{result['command']}`: {len(trajs)} calculator trajectories ({args.prompts} groups x G={G}), "
             f"{turns} model turns, {model_tokens} model tokens and {obs_tokens} observation tokens; mean "
             f"acceptance length (tokens per verification step, bonus included; gamma {args.spec_tokens})", "",
             "| the group's tree holds | " + " | ".join(f"{n} references" for n in refs_list) + " |",
             "|---|" + "---|" * len(refs_list)]
    lines += [f"| {name} | " + " | ".join(f"{rows[name][n]:.3f}" for n in refs_list) + " |" for name in TREES]
    (out / "dgds_multiturn.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
