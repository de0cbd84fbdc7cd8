"""Where a speculating vLLM instance's engine step goes, by batch size and draft length.

    python -m bench.spec_breakdown [--model default] [--batches 1,2,4,8,16,32] [--gammas 0,2,4,8,adaptive]
                                   [--tokens 128] [--repeats 2] [--rollout]

Two one-core vLLM CPU instances of the same model, timed per engine step by ``bench.harness.spec_probe``
(vLLM's ``--scheduler-cls`` and ``--worker-cls`` hooks; nothing in vLLM or Seer changes):
``plain`` without speculation and ``spec`` with the DGDS proposer (gamma_max 8, a DGDS server in
this process), whose draft length the probe forces per phase (``adaptive`` is Algorithm 1).
A phase is B requests (groups of up to 8 samples of one prompt, temperature 1.0, ``--tokens``
each, ``ignore_eos``) on one instance; phases run one at a time, alternating instances and
variants, each repeat in reverse order. ``--rollout`` adds a long-tail phase per instance (8
groups x 8 with the model's own lengths, sampled once on ``plain`` and replayed by both) whose
steps are split into bulk (16 or more rows) and tail (4 or fewer).

Per (variant, B): decode steps only (a step that prefilled any row is left out), their mean
engine step, split into the scheduler (``schedule``), the worker (state update, input
preparation, forward, logits, sampler or rejection sampler, bookkeeping, the proposer), vLLM's
``update_from_output`` and ``post_step`` and the rest (IPC between the engine and the worker, the
output queue); tokens verified and emitted per step; the DGDS client thread's CPU per step.
Writes bench/results/spec_breakdown/spec_breakdown.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench.harness.provenance import code_version
from seer.dgds.vllm import EXECUTOR_ARGS, speculative_config
from seer.procs.vllm_metrics import spec_decode_counters
from seer.request_ids import request_id

WORKER_PARTS = ("update_states_s", "prepare_inputs_s", "model_forward_s", "sample_s", "bookkeeping_sync_s",
                "propose_draft_token_ids_s")
DGDS_PARTS = ("dgds_append_s", "dgds_policy_s", "dgds_draft_s")


def _load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def join_steps(engine: list[dict], worker: list[dict]) -> list[dict]:
    """Each engine step with the worker step that ran inside it (same CLOCK_MONOTONIC)."""
    worker = sorted(worker, key=lambda r: r["t0"])
    out, j = [], 0
    for e in sorted(engine, key=lambda r: r["step_t0"]):
        end = e["step_t0"] + e["step_s"]
        while j < len(worker) and worker[j]["t0"] < e["step_t0"]:
            j += 1
        w = worker[j] if j < len(worker) and worker[j]["t0"] <= end else None
        if w is not None:
            j += 1
        out.append({**e, "worker": w})
    return out


def summarize(steps: list[dict]) -> dict:
    """Means per decode step (ms) of every part, and the step's shape."""
    dec = [s for s in steps if s["prefill_rows"] == 0 and s["new_rows"] == 0 and s["worker"]]
    if not dec:
        return {"steps": 0}
    n = len(dec)

    def mean(f) -> float:
        return sum(f(s) for s in dec) / n

    w = lambda s, k: s["worker"].get(k, 0.0)  # noqa: E731
    d = {
        "steps": n,
        "rows": mean(lambda s: s["rows"]),
        "verified_tokens": mean(lambda s: s["tokens"]),
        "spec_tokens": mean(lambda s: s["spec_tokens"]),
        "spec_rows": mean(lambda s: s["spec_rows"]),
        "step_ms": 1e3 * mean(lambda s: s["step_s"]),
        "step_ms_median": 1e3 * statistics.median(s["step_s"] for s in dec),
        "schedule_ms": 1e3 * mean(lambda s: s["schedule_s"]),
        "update_from_output_ms": 1e3 * mean(lambda s: s.get("update_s", 0.0)),
        "post_step_ms": 1e3 * mean(lambda s: s.get("post_s", 0.0)),
        "worker_ms": 1e3 * mean(lambda s: w(s, "execute_s") + w(s, "sample_tokens_s")),
        "rejection_steps": sum(1 for s in dec if s["worker"].get("rejection")) / n,
    }
    for k in WORKER_PARTS + DGDS_PARTS:
        d[k.removesuffix("_s") + "_ms"] = 1e3 * mean(lambda s: w(s, k))
    d["logits_and_rest_of_execute_ms"] = 1e3 * mean(
        lambda s: w(s, "execute_s") - w(s, "update_states_s") - w(s, "prepare_inputs_s") - w(s, "model_forward_s"))
    d["rest_of_sample_tokens_ms"] = 1e3 * mean(
        lambda s: w(s, "sample_tokens_s") - w(s, "sample_s") - w(s, "bookkeeping_sync_s")
        - w(s, "propose_draft_token_ids_s"))
    d["engine_other_ms"] = d["step_ms"] - d["schedule_ms"] - d["update_from_output_ms"] - d["post_step_ms"] - d["worker_ms"]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def _requests(prompts, n: int, tokens: int | dict, prefix: str, seed: int, group_size: int = 8):
    from seer.types import GenerateRequest, SamplingParams

    out = []
    for k in range(n):
        g, s = divmod(k, group_size)
        p = prompts[g % len(prompts)]
        m = tokens if isinstance(tokens, int) else max(1, tokens[(g, s)])
        out.append(((g, s), GenerateRequest(request_id(g, s, prefix), p.prompt_ids, m,
                                            SamplingParams(temperature=1.0, max_tokens=m, seed=seed * 100_000 + k,
                                                           ignore_eos=True), logprobs=False)))
    return out


async def run_phase(client, reqs) -> tuple[float, float, int, dict]:
    before = spec_decode_counters(await client.metrics_text())
    t0 = time.perf_counter()
    res = await asyncio.gather(*(client.generate(r) for _, r in reqs))
    t1 = time.perf_counter()
    c = spec_decode_counters(await client.metrics_text()) - before
    return t0, t1, sum(len(r.token_ids) for r in res), {
        "drafts": c.drafts, "draft_tokens": c.draft_tokens, "accepted_tokens": c.accepted_tokens,
        "mean_acceptance_length": None if c.mean_acceptance_length is None else round(c.mean_acceptance_length, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="embedded model preset (tiny, default) or a checkpoint directory")
    ap.add_argument("--batches", default="1,2,4,8,16,32", help="batch sizes B (requests at once)")
    ap.add_argument("--gammas", default="0,2,4,8,adaptive", help="draft lengths of the spec instance's phases")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    ap.add_argument("--repeats", type=int, default=2, help="the grid this many times, alternating order")
    ap.add_argument("--rollout", action="store_true", help="add a long-tail rollout phase per instance")
    ap.add_argument("--executor", choices=("vllm", "dgds"), default="vllm",
                    help="the spec instance's executor: vLLM's, or seer.dgds.vllm.executor (drafts without an RPC)")
    ap.add_argument("--seed", type=int, default=5, help="sampling seed of the prompts and requests")
    ap.add_argument("--out", default="bench/results/spec_breakdown", help="where the JSON, table and per-step logs go")
    ap.add_argument("--name", default="spec_breakdown", help="file name of the JSON and table")
    ap.add_argument("--render", action="store_true",
                    help="re-analyse a recorded run (its JSON and the per-step logs under --out/logs) without running")
    args = ap.parse_args(argv)
    if args.render:
        return render_recorded(Path(args.out), args.name)
    batches = [int(b) for b in args.batches.split(",")]
    gammas = [g.strip() for g in args.gammas.split(",")]

    from transformers import AutoTokenizer

    from seer.dgds.server.grpc_server import DgdsServer
    from seer.fleet.instance import InstanceSpec
    from seer.fleet.pool import InstancePool
    from seer.model import resolve_model
    from seer.procs import free_port
    from seer.tasks import TaskConfig, encode_prompts, load_task

    model = str(resolve_model(args.model))
    tok = AutoTokenizer.from_pretrained(model)
    prompts = encode_prompts(load_task(TaskConfig(num_prompts=8, seed=args.seed)).records, tok, 4096)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe_root = out / "logs" / "probe" / args.name  # per-step JSON lines (ignored by git)
    for name in ("plain", "spec"):
        for f in ("engine.jsonl", "worker.jsonl", "gamma"):
            (probe_root / name / f).unlink(missing_ok=True)
    dgds = DgdsServer("127.0.0.1", 0).start()
    common = dict(max_model_len=4096, kv_cache_bytes=256 << 20, max_num_seqs=64)
    probe = ("--scheduler-cls", "bench.harness.spec_probe.TimedScheduler", "--worker-cls", "bench.harness.spec_probe.TimedCPUWorker",
             "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")
    pypath = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p)
    specs = [
        InstanceSpec("spec", model, free_port(), cpus="0", **common,
                     extra_args=(*probe, "--speculative-config", speculative_config(8),
                                 *(EXECUTOR_ARGS if args.executor == "dgds" else ())),
                     env={"SEER_DGDS_ADDRESS": dgds.address, "PYTHONPATH": pypath,
                          "SEER_SPEC_PROBE_DIR": str(probe_root / "spec")}),
        InstanceSpec("plain", model, free_port(), cpus="1", **common, extra_args=probe,
                     env={"PYTHONPATH": pypath, "SEER_SPEC_PROBE_DIR": str(probe_root / "plain")}),
    ]
    variants = ["plain"] + [f"spec:{g}" for g in gammas]
    phases: list[dict] = []
    print("starting two vLLM instances (a minute or two)", flush=True)
    try:
        with InstancePool.launch(specs, out / "logs" / args.name) as pool:
            spec_client, plain_client = pool.clients

            async def go() -> None:
                # warm-up: kernels and the proposer's first drafts, untimed
                for c in (spec_client, plain_client):
                    await run_phase(c, _requests(prompts, 8, 32, f"warm-{c.name}-", args.seed))
                k = 0
                for r in range(args.repeats):
                    order = batches if r % 2 == 0 else batches[::-1]
                    for b in order:
                        vs = variants if (r + batches.index(b)) % 2 == 0 else variants[::-1]
                        for v in vs:
                            client = plain_client if v == "plain" else spec_client
                            if v != "plain":
                                (probe_root / "spec" / "gamma").write_text(v.split(":")[1])
                                await asyncio.sleep(0.05)
                            t0, t1, n, c = await run_phase(client, _requests(prompts, b, args.tokens, f"p{k}-", args.seed + k))
                            phases.append(dict(kind="grid", variant=v, batch=b, repeat=r, t0=t0, t1=t1, tokens=n,
                                               tokens_per_s=round(n / (t1 - t0), 1), spec=c))
                            print(f"  {v:>14} B={b:<3} {n / (t1 - t0):8.1f} tok/s", flush=True)
                            k += 1
                if args.rollout:
                    lengths: dict = {}
                    warm = _requests(prompts, 64, 2048, "len-", args.seed)
                    from seer.types import SamplingParams, GenerateRequest

                    res = await asyncio.gather(*(plain_client.generate(GenerateRequest(
                        r.request_id, r.prompt_ids, 2048, SamplingParams(temperature=1.0, max_tokens=2048, seed=r.sampling.seed),
                        logprobs=False)) for _, r in warm))
                    for (key, _), x in zip(warm, res):
                        lengths[key] = len(x.token_ids)
                    for r in range(args.repeats):
                        for v in (["plain", "spec:adaptive"] if r % 2 == 0 else ["spec:adaptive", "plain"]):
                            client = plain_client if v == "plain" else spec_client
                            if v != "plain":
                                (probe_root / "spec" / "gamma").write_text("adaptive")
                            t0, t1, n, c = await run_phase(client, _requests(prompts, 64, lengths, f"roll{r}{v[0]}-", args.seed))
                            phases.append(dict(kind="rollout", variant=v, batch=64, repeat=r, t0=t0, t1=t1, tokens=n,
                                               tokens_per_s=round(n / (t1 - t0), 1), spec=c,
                                               lengths=dict(total=sum(lengths.values()), longest=max(lengths.values()))))
                            print(f"  rollout {v:>14} {n / (t1 - t0):8.1f} tok/s", flush=True)
                await pool.aclose_clients()

            asyncio.run(go())
    finally:
        dgds.stop(0.5)
    time.sleep(0.5)
    steps = {name: join_steps(_load(probe_root / name / "engine.jsonl"), _load(probe_root / name / "worker.jsonl"))
             for name in ("plain", "spec")}
    table = analyse(phases, steps)
    commit, dirty = code_version()
    result = {
        "bench": "spec_breakdown",
        "command": "python -m bench.spec_breakdown " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d"), "commit": commit, "dirty": dirty, "model": model,
        "tokens_per_request": args.tokens, "executor": args.executor, "batches": batches, "gammas": gammas, "repeats": args.repeats,
        "phases": phases, "breakdown": table,
        "load_average": list(os.getloadavg()), "machine": platform.platform(),
    }
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render(result)
    (out / f"{args.name}.md").write_text(md)
    print(md)
    return 0


def render_recorded(out: Path, name: str) -> int:
    """Recompute the breakdown of a recorded run from its phases and per-step logs; the record
    keeps its command, date and commit, and notes the commit that re-rendered it."""
    path = out / f"{name}.json"
    result = json.loads(path.read_text())
    probe_root = out / "logs" / "probe" / name
    steps = {n: join_steps(_load(probe_root / n / "engine.jsonl"), _load(probe_root / n / "worker.jsonl"))
             for n in ("plain", "spec")}
    if not steps["spec"]:
        raise SystemExit(f"no per-step logs under {probe_root}")
    result["breakdown"] = analyse(result["phases"], steps)
    result["rendered_by"] = code_version()[0]
    path.write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(render(result))
    return 0


def analyse(phases: list[dict], steps: dict[str, list[dict]]) -> list[dict]:
    """One row per (kind, variant, batch or phase): the summary of its decode steps."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    tps: dict[tuple, list[float]] = defaultdict(list)
    spec: dict[tuple, list[dict]] = defaultdict(list)
    cpu: dict[tuple, list[float]] = defaultdict(list)  # the client thread's CPU per step, per phase
    for ph in phases:
        inst = "plain" if ph["variant"] == "plain" else "spec"
        mine = [s for s in steps[inst] if ph["t0"] <= s["step_t0"] <= ph["t1"]]
        c = [s["worker"]["client_cpu_s"] for s in mine if s["worker"] and "client_cpu_s" in s["worker"]]
        if len(c) > 1:  # within the phase only: the thread also runs between phases
            cpu[("grid", ph["variant"], ph["batch"]) if ph["kind"] == "grid" else ("rollout", ph["variant"], "all")
                ].append(round(1e3 * (c[-1] - c[0]) / (len(c) - 1), 3))
        if ph["kind"] == "grid":
            keys = [("grid", ph["variant"], ph["batch"])]
            parts = {keys[0]: mine}
        else:
            parts = {("rollout", ph["variant"], "bulk"): [s for s in mine if s["rows"] >= 16],
                     ("rollout", ph["variant"], "tail"): [s for s in mine if s["rows"] <= 4],
                     ("rollout", ph["variant"], "all"): mine}
        for key, ss in parts.items():
            groups[key] += ss
        k0 = ("grid", ph["variant"], ph["batch"]) if ph["kind"] == "grid" else ("rollout", ph["variant"], "all")
        tps[k0].append(ph["tokens_per_s"])
        spec[k0].append(ph["spec"])
    rows = []
    for key, ss in groups.items():
        kind, variant, b = key
        d = {"kind": kind, "variant": variant, "batch": b, **summarize(ss)}
        if cpu.get(key):
            d["client_thread_cpu_ms_per_phase"] = cpu[key]
            d["client_thread_cpu_ms"] = round(sum(cpu[key]) / len(cpu[key]), 4)
        if key in tps:
            d["tokens_per_s"] = [round(x, 1) for x in tps[key]]
            acc = [c for c in spec[key] if c["drafts"]]
            if acc:
                drafts = sum(c["drafts"] for c in acc)
                d["mean_acceptance_length"] = round(1 + sum(c["accepted_tokens"] for c in acc) / drafts, 3)
        rows.append(d)
    rows.sort(key=lambda d: (d["kind"], str(d["batch"]).zfill(4), d["variant"]))
    return rows


def render(result: dict) -> str:
    rows = result["breakdown"]
    md = [f"`{result['command']}` (commit {result['commit']}{', uncommitted changes' if result['dirty'] else ''}, "
          f"{result['date']}; load average {result['load_average'][0]:.1f} at the end). Means per decode step, ms; "
          "one-core vLLM CPU instances; `spec:g` = the DGDS proposer forced to g draft tokens per row "
          "(`adaptive`: Algorithm 1).", "",
          "| phase | B | variant | steps | rows | verified tok | drafted tok | step ms | schedule | update states + prepare | "
          "forward | logits + rest | sampler / rejection | bookkeeping | propose (DGDS: append / policy / draft) | "
          "update_from_output + post_step | engine other (IPC) | client thread CPU | tok/s (per repeat) | accept len |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in rows:
        if not d.get("steps"):
            continue
        prop = f"{d['propose_draft_token_ids_ms']:.2f}"
        if d["variant"] != "plain":
            prop += f" ({d['dgds_append_ms']:.2f} / {d['dgds_policy_ms']:.2f} / {d['dgds_draft_ms']:.2f})"
        md.append(
            f"| {d['kind']} | {d['batch']} | {d['variant']} | {d['steps']} | {d['rows']:.1f} | {d['verified_tokens']:.1f} | "
            f"{d['spec_tokens']:.1f} | **{d['step_ms']:.2f}** | {d['schedule_ms']:.2f} | "
            f"{d['update_states_ms'] + d['prepare_inputs_ms']:.2f} | {d['model_forward_ms']:.2f} | "
            f"{d['logits_and_rest_of_execute_ms']:.2f} | {d['sample_ms']:.2f} | {d['bookkeeping_sync_ms']:.2f} | {prop} | "
            f"{d['update_from_output_ms'] + d['post_step_ms']:.2f} | {d['engine_other_ms']:.2f} | "
            f"{d.get('client_thread_cpu_ms', 0.0):.2f} | {' / '.join(map(str, d.get('tokens_per_s', [])))} | "
            f"{d.get('mean_acceptance_length', '-')} |")
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
