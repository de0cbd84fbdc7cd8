"""Grouped speculative decoding, end to end on real vLLM instances.

    python bench/dgds_e2e.py [--model tiny|default|DIR] [--prompts 8] [--group-size 8] [--max-tokens 256]

Same prompts, same per-request seeds, three ways:
  * group        vLLM + the DGDS proposer, requests named ``<prefix>g<group>-s<sample>`` (group trees)
  * per-request  the same instance, ids prefixed ``solo-`` (each request drafts from its own tokens)
  * none         a second vLLM instance without speculation
Both instances start together (one core each); the phases then run one after the other. With
``--probe-first`` each group's sample 0 runs before its siblings (Seer's context-aware order), so
siblings can draft from a finished response; by default all G samples run at once.
``--repeats N`` runs the three phases N times, in alternating order (group, per-request, none;
then none, per-request, group; ...), each repeat with fresh request ids (fresh group trees), and
reports the totals plus each row's tokens/s relative to ``none`` of the same repeat (median over
repeats): on a machine shared with other jobs the ratio is what to read, not the absolute rate.
Acceptance length is vLLM's own: 1 + accepted / drafts from the /metrics counter deltas of a phase.

Equal work in every phase (as bench.compare's replay mode): an untimed warm-up on the plain
instance samples every request's length once; every phase then generates exactly those lengths
(``ignore_eos``, ``max_tokens`` per request), so the rows' tokens/s compare the same token counts
and differ by the drafting only (``--no-replay``: each phase samples its own lengths, so a row
that happens to sample one long response more is slower for that alone).
Writes bench/results/dgds_e2e/dgds_e2e.{json,md,png}.
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
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.progress import Progress

from seer.dgds.vllm import speculative_config
from seer.procs.vllm_metrics import spec_decode_counters
from seer.request_ids import request_id
from seer.types import SpecDecodeCounters


@dataclass(frozen=True)
class PhaseResult:
    name: str
    wall_s: float
    output_tokens: int
    requests: int
    spec: SpecDecodeCounters  # vLLM's counters over the phase

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.spec.mean_acceptance_length

    @staticmethod
    def total(name: str, parts: list[PhaseResult]) -> PhaseResult:
        return PhaseResult(name, sum(p.wall_s for p in parts), sum(p.output_tokens for p in parts),
                           sum(p.requests for p in parts), sum((p.spec for p in parts), SpecDecodeCounters()))

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "spec"} | asdict(self.spec)
        d["tokens_per_s"] = round(self.tokens_per_s, 1)
        m, rate = self.spec.mean_acceptance_length, self.spec.acceptance_rate
        d["mean_acceptance_length"] = None if m is None else round(m, 3)
        d["acceptance_rate"] = None if rate is None else round(rate, 4)
        return d


async def run_phase(client, name: str, id_prefix: str, prompts, group_size: int, max_tokens: int,
                    temperature: float, seed: int, probe_first: bool, progress=None,
                    lengths: dict[tuple[int, int], int] | None = None,
                    record: dict[tuple[int, int], int] | None = None) -> PhaseResult:
    """All requests of the workload on one instance; counters diffed around it.

    `lengths`: (group, sample) -> output tokens; each request then generates exactly that many
    (ignore_eos), as the warm-up sampled them. `record`: filled with each request's output length.
    """
    from seer.types import GenerateRequest, SamplingParams

    def req(i, p, k):
        n = max(1, lengths[(i, k)]) if lengths is not None else max_tokens
        return (i, k), GenerateRequest(request_id(i, k, id_prefix), p.prompt_ids, n,
                                       SamplingParams(temperature=temperature, max_tokens=n,
                                                      seed=seed * 100_000 + i * 100 + k,
                                                      ignore_eos=lengths is not None), logprobs=False)

    waves = ([[req(i, p, 0) for i, p in enumerate(prompts)],
              [req(i, p, k) for i, p in enumerate(prompts) for k in range(1, group_size)]]
             if probe_first else [[req(i, p, k) for i, p in enumerate(prompts) for k in range(group_size)]])
    task = progress.add_task(name, total=sum(len(w) for w in waves)) if progress else None

    async def one(key_req):
        key, r = key_req
        res = await client.generate(r)
        if record is not None:
            record[key] = len(res.token_ids)
        if progress:
            progress.advance(task)
        return res

    before = spec_decode_counters(await client.metrics_text())
    t0 = time.perf_counter()
    results = []
    for wave in waves:
        results += await asyncio.gather(*(one(r) for r in wave))
    wall = time.perf_counter() - t0
    d = spec_decode_counters(await client.metrics_text()) - before
    return PhaseResult(name, wall, sum(len(r.token_ids) for r in results), len(results), d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="embedded model preset (tiny, default) or a checkpoint directory")
    ap.add_argument("--prompts", type=int, default=8, help="prompts (groups) of the built-in task")
    ap.add_argument("--group-size", type=int, default=8, help="responses per prompt (G)")
    ap.add_argument("--max-tokens", type=int, default=256, help="longest response, in tokens")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ap.add_argument("--spec-tokens", type=int, default=8, help="gamma_max: most draft tokens per step")
    ap.add_argument("--probe-first", action="store_true", help="send one probe request per group first, as context-aware scheduling does")
    ap.add_argument("--seed", type=int, default=11, help="seeds the prompts")
    ap.add_argument("--out", default="bench/results/dgds_e2e", help="where the JSON, markdown and plot go")
    ap.add_argument("--name", default="dgds_e2e", help="stem of the result files")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the three phases this many times, alternating their order (fresh ids each time)")
    ap.add_argument("--no-replay", action="store_true",
                    help="let every phase sample its own lengths instead of replaying the warm-up's")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from seer.dgds.server.grpc_server import DgdsServer
    from seer.model import resolve_model
    from seer.fleet.instance import InstanceSpec
    from seer.procs import free_port
    from seer.fleet.pool import InstancePool
    from seer.tasks import TaskConfig, encode_prompts, load_task

    model = str(resolve_model(args.model))
    tok = AutoTokenizer.from_pretrained(model)
    prompts = encode_prompts(load_task(TaskConfig(num_prompts=args.prompts, seed=args.seed)).records, tok, 4096)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dgds = DgdsServer("127.0.0.1", 0).start()
    max_model_len = max(2048, max(len(p.prompt_ids) for p in prompts) + args.max_tokens)
    common = dict(max_model_len=max_model_len, kv_cache_bytes=128 << 20, max_num_seqs=max(64, args.prompts * args.group_size))
    # No chunked prefill: vLLM 0.32's CPU runner fails ("CPU Generator does not use offset") on a
    # seeded request whose prefill is split over steps (the default model's prompts, 64 at once).
    unsplit = ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")
    specs = [
        InstanceSpec("spec", model, free_port(), cpus="0", **common,
                     extra_args=(*unsplit, "--speculative-config", speculative_config(args.spec_tokens)),
                     env={"SEER_DGDS_ADDRESS": dgds.address}),
        InstanceSpec("plain", model, free_port(), cpus="1", **common, extra_args=unsplit),
    ]
    print("starting two vLLM instances (a minute or two)", flush=True)
    try:
        with InstancePool.launch(specs, out / "logs" / args.name) as pool:
            spec_client, plain_client = pool.clients

            async def run() -> list[list[PhaseResult]]:
                kw = dict(prompts=prompts, group_size=args.group_size, max_tokens=args.max_tokens,
                          temperature=args.temperature, seed=args.seed, probe_first=args.probe_first)
                rows = [("group", spec_client, "e2e-grp-"), ("per-request", spec_client, "solo-e2e-req-"),
                        ("none", plain_client, "e2e-none-")]
                repeats = []
                with Progress() as progress:
                    if not args.no_replay:  # untimed: samples the lengths every phase then generates
                        await run_phase(plain_client, "warm-up (lengths)", "e2e-warm-", progress=progress,
                                        record=lengths, **kw)
                        kw["lengths"] = dict(lengths)
                        # and a short untimed warm-up of the speculative instance (one group)
                        await run_phase(spec_client, "warm-up (speculative)", "solo-e2e-warm-",
                                        progress=progress, **{**kw, "prompts": prompts[:1]})
                    for r in range(args.repeats):
                        tag = f"rep{r}-" if args.repeats > 1 else ""
                        order = rows if r % 2 == 0 else rows[::-1]
                        done = {name: await run_phase(client, name + (f" #{r}" if tag else ""), prefix + tag,
                                                      progress=progress, **kw)
                                for name, client, prefix in order}
                        repeats.append([done[name] for name, _, _ in rows])
                await pool.aclose_clients()
                return repeats

            lengths: dict[tuple[int, int], int] = {}
            repeats = asyncio.run(run())
    finally:
        dgds.stop(0.5)
    names = ["group", "per-request", "none"]
    phases = [PhaseResult.total(n, [rep[i] for rep in repeats]) for i, n in enumerate(names)]
    # tokens/s of each row relative to `none` in the same repeat, median over repeats
    ratios = {n: statistics.median(rep[i].tokens_per_s / rep[2].tokens_per_s for rep in repeats)
              for i, n in enumerate(names)}

    result = {
        "bench": "dgds_e2e",
        "command": "python bench/dgds_e2e.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": model, "prompts": args.prompts, "group_size": args.group_size, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "spec_tokens": args.spec_tokens, "probe_first": args.probe_first,
        "repeats": args.repeats, "replay": not args.no_replay,
        "replayed_lengths": ({"tokens": sum(lengths.values()), "longest": max(lengths.values()),
                              "median": statistics.median(lengths.values()), "requests": len(lengths)}
                             if lengths else None),
        "phases": [p.as_dict() for p in phases],
        "tokens_per_s_vs_none": {n: round(r, 3) for n, r in ratios.items()},
        "per_repeat": [[p.as_dict() for p in rep] for rep in repeats],
        "load_average": list(os.getloadavg()), "machine": platform.platform(),
    }
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        f"{args.prompts} groups x G={args.group_size} of `{Path(model).name}`, max {args.max_tokens} tokens, temperature "
        f"{args.temperature}, gamma_max={args.spec_tokens}, {'probe first' if args.probe_first else 'all samples at once'}; "
        "one vLLM CPU instance (1 core) per row"
        + (f"; {args.repeats} repeats in alternating order, totals over them" if args.repeats > 1 else "")
        + (f"; every row generates the warm-up's lengths ({sum(lengths.values())} tokens, longest "
           f"{max(lengths.values())}, ignore_eos)" if lengths else "; each row samples its own lengths")
        + f"; load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| drafting | output tokens/s | vs none | mean acceptance length | acceptance rate | output tokens | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        d = p.as_dict()
        mal = "-" if d["mean_acceptance_length"] is None else f"{d['mean_acceptance_length']:.2f}"
        rate = "-" if d["acceptance_rate"] is None else f"{d['acceptance_rate']:.3f}"
        md.append(f"| {p.name} | {p.tokens_per_s:.1f} | {ratios[p.name]:.2f}x | {mal} | {rate} | {p.output_tokens} "
                  f"| {p.wall_s:.1f} |")
    (out / f"{args.name}.md").write_text("\n".join(md) + "\n")
    plot(phases, out / f"{args.name}.png")
    print("\n".join(md))
    return 0


def plot(phases: list[PhaseResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.5))
    names = [p.name for p in phases]
    a.bar(names, [p.tokens_per_s for p in phases], color=["tab:blue", "tab:orange", "tab:grey"])
    a.set_ylabel("output tokens/s")
    b.bar(names, [p.mean_acceptance_length or 1.0 for p in phases], color=["tab:blue", "tab:orange", "tab:grey"])
    b.set_ylabel("mean acceptance length")
    fig.suptitle("DGDS proposer in vLLM: group vs per-request drafts vs no speculation")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
