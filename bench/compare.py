"""Rollout throughput, configuration by configuration, on real vLLM instances: `python -m bench.compare`.

    python -m bench.compare                                # the default workload, whole ladder (the README's table)
    python -m bench.compare --preset tiny [--mode model|trace|replay] [--groups 16] [--group-size 4] ...
    python -m bench.compare --configs baseline,context --repeats 2   # any setting is a flag
    python -m bench.compare --render DIR                   # re-summarize DIR/compare.json

The same workload (prompts, per-chunk seeds, sampling, instances) runs under each configuration
of the ladder (seer.sim.ladder): baseline group round-robin, + divided rollout, + context-aware
scheduling, + grouped speculative decoding (DGDS), and oracle longest-first. Instances start
once and serve every configuration; the speculative one needs vLLM's speculative flag, so it has
its own instances (same cores, idle while the others run) and the DGDS server. Configurations
alternate in order across repeats (forward, then backward) so drift on a shared machine does not
favour one; every run starts with the instances' prefix caches emptied, and an untimed warm-up
runs first on each pool.

Modes: `model` (default) generates with the model on the built-in task, lengths are the model's
own; the oracle gets the lengths of the warm-up run (same chunking, same seeds). `trace` gives every
request a hidden heavy-tailed, group-correlated target length (seer.sim.workloads) that only the
instances (bench.harness.trace_backend) and the oracle see. `replay` takes those target lengths from the
model itself: the warm-up run (model mode) samples every request's length once, and every
configuration and repeat then generates with the model up to exactly those lengths. Model mode's
wall time is dominated by the longest sampled response, which differs from run to run (a
response that loops to the maximum length, or not); replay keeps the model's own heavy-tailed
lengths and makes the configurations differ by scheduling only.

Writes <out>/compare.json, compare.md (ratios to the baseline, spread over repeats) and PNGs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seer.config_help import field_comments
from seer.rollout.stats import stats_from_result
from seer.dgds.vllm import EXECUTOR_ARGS, speculative_config
from seer.types import InstanceStats, IterationStats, PromptSpec, SamplingParams, SpecDecodeCounters
from seer.kvpool import KVPool
from seer.kvpool.config import KVPoolConfig
from seer.scheduler import RolloutDriver, SchedulerConfig, true_lengths_from_samples

from bench.harness.breakdown import breakdown, format_breakdown, scrape
from bench.harness.instances import instance_specs, run_command, throughput_bars
from seer.sim.ladder import BenchConfig, parse_bool, select
from bench.harness.trace_backend import TraceBackend
from seer.sim.workloads import LengthModel

@dataclass(frozen=True)
class CompareSettings:
    # model: each run samples its own lengths; replay: an untimed warm-up samples them once and every
    # configuration replays them (equal work); trace: synthetic lengths (mean_tokens), EOS ignored
    mode: str = "model"
    model: str = "tiny"  # an embedded preset (tiny, default) or a local HF checkpoint directory
    groups: int = 16  # prompts (GRPO groups) of the workload
    group_size: int = 4  # samples per prompt (G)
    max_tokens: int = 384  # longest response, in tokens
    mean_tokens: int = 120  # trace mode: mean response length of the synthetic lengths
    chunk_size: int = 128  # tokens per chunk of the chunked configurations
    instances: int = 2  # vLLM instances per configuration, one CPU core each
    kv_cache_bytes: int = 2 << 20  # per instance; small on purpose, so that the baseline overloads it
    max_num_seqs: int = 64  # vLLM's --max-num-seqs per instance
    max_model_len: int = 2048  # the instances' context length
    repeats: int = 3  # runs of every configuration, in alternating order
    temperature: float = 1.0  # sampling temperature
    seed: int = 7  # seeds the prompts, the sampled lengths and the sampling
    spec_tokens: int = 8  # gamma_max of grouped speculative decoding
    # A Mooncake KV pool under the chunked configurations (divided, context, grouped SD, oracle): a
    # chunk that changes instance loads its prefix instead of recomputing it, so placement may move
    # it. The baseline keeps its own plain instances (group round-robin never moves a request).
    kv_pool: bool = False
    kv_pool_bytes: int = 1 << 30  # memory of that pool
    configs: str = "all"  # comma-separated configurations (seer.sim.ladder), e.g. baseline,context; or all
    verbose: int = 0  # 1: print each run's time breakdown (bench.harness.breakdown)
    preset: str = ""  # a named workload (PRESETS); flags given with it override its settings
    out: str = "bench/results/compare"  # where compare.json, compare.md and the plots go

    def __post_init__(self) -> None:
        if self.mode not in ("model", "trace", "replay"):
            raise ValueError(f"--mode must be model, trace or replay, got {self.mode!r}")
        if self.groups < 1 or self.group_size < 2 or self.repeats < 1 or self.chunk_size < 1:
            raise ValueError("groups >= 1, group_size >= 2, repeats >= 1 and chunk_size >= 1 are required")


# Named workloads. `default` (what `seer-bench compare` runs without flags): the embedded default
# model on 32 prompts of the built-in task x G=16 (512 requests, max 2048 tokens, heavy-tailed
# lengths), two instances whose KV memory, not max_num_seqs, bounds concurrency (docs/bench.md says
# why 32 MiB), the whole ladder, the chunked configurations on a Mooncake KV pool as `seer-run` runs
# them (the paper's divided rollout includes its global KV pool). 32 groups, not `seer-run`'s 16 per
# iteration, put the instances where the paper's are: each is handed ~4.2x the KV it holds (the
# paper's 1.7-6.5x), and group round-robin loses time to imbalance and preemption above the bound
# that the longest response's own decode sets. With 16 groups (`run-iteration`) it runs at that
# bound: it starts the longest response at 0 s and never interrupts it, which leaves nothing to win
# (docs/bench.md, "16 groups: bound by one response"). `default-longtail`: 16 groups without grouped
# SD (the runs recorded before it joined the default). `tiny`: the CompareSettings defaults (tiny
# model, model mode), which tests and quick checks build on.
LONGTAIL = dict(mode="replay", model="default", groups=16, group_size=16, max_tokens=2048, max_model_len=4096,
                chunk_size=256, kv_cache_bytes=32 << 20, max_num_seqs=256, seed=0)
PRESETS: dict[str, dict] = {
    "default": dict(LONGTAIL, groups=32, configs="all", kv_pool=True),
    "run-iteration": dict(LONGTAIL, configs="all", kv_pool=True),
    "default-longtail": dict(LONGTAIL, configs="baseline,divided,context,oracle"),
    "tiny": {},
}
DEFAULT_PRESET = "default"


@dataclass
class ConfigRun:
    config: str
    repeat: int
    position: int  # order within the repeat
    stats: IterationStats
    mean_acceptance_length: float | None
    lengths: dict = field(default_factory=dict)


def _acceptance(before, after) -> float | None:
    return sum((a.spec - b.spec for a, b in zip(after, before)), SpecDecodeCounters()).mean_acceptance_length


async def run_one(backends, clients, cfg: BenchConfig, prompts: list[PromptSpec], s: CompareSettings,
                  prefix: str, true_lengths=None, kv_pool: bool = False) -> tuple[IterationStats, float | None, dict]:
    """One iteration under `cfg`; caches (and the KV pool) emptied first so no run reuses another's KV.

    `kv_pool`: the instances share a KV pool, so placement may move a chunk (its prefix is loaded);
    without one a chunk that changes instance recomputes its prefix, and placement keeps it.
    """
    for i, c in enumerate(clients):
        await c.reset_prefix_cache(external=kv_pool and i == 0)
    sched = SchedulerConfig(policy=cfg.policy, chunk_size=cfg.chunk_size or s.chunk_size, max_running=s.max_num_seqs,
                            kv_pool=kv_pool, **dict(cfg.sched))
    driver = RolloutDriver(backends, sched)
    sampling = SamplingParams(temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed,
                              ignore_eos=s.mode == "trace")  # replay: TraceBackend sets it per chunk
    before = [await c.telemetry() for c in clients]
    metrics_before = await scrape(clients)
    result = await driver.run(prompts, group_size=s.group_size, sampling=sampling, request_id_prefix=prefix,
                              true_lengths=true_lengths if cfg.oracle else None)
    metrics_after = await scrape(clients)
    after = [await c.telemetry() for c in clients]
    stats = stats_from_result(result, 0, [b.name for b in backends])
    stats.extra["breakdown"] = breakdown(result.chunks, result.start_time, result.end_time,
                                         metrics_before, metrics_after)
    return stats, _acceptance(before, after), true_lengths_from_samples(result.samples)


def _prompts(s: CompareSettings, model_dir: Path) -> list[PromptSpec]:
    from transformers import AutoTokenizer

    from seer.tasks import TaskConfig, encode_prompts, load_task

    tok = AutoTokenizer.from_pretrained(model_dir)
    records = load_task(TaskConfig(num_prompts=s.groups, seed=s.seed)).records
    return encode_prompts(records, tok, s.max_model_len, min_new_tokens=s.max_tokens)


def run(s: CompareSettings, progress=print) -> dict:
    from seer.dgds.server.grpc_server import DgdsServer
    from seer.model import ensure_model
    from seer.procs import cpu_sets

    configs = select(s.configs)
    model_dir = Path(s.model) if Path(s.model).is_dir() else ensure_model(s.model, progress=False)
    prompts = _prompts(s, model_dir)
    hidden = None
    if s.mode == "trace":
        hidden = LengthModel(s.mean_tokens, s.max_tokens).sample(s.groups, s.group_size, s.seed)
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = cpu_sets(s.instances)
    want_sd = any(c.speculate for c in configs)
    want_pooled = s.kv_pool and any(not c.speculate and c.policy != "group_rr" for c in configs)
    want_plain = not s.kv_pool or any(c.policy == "group_rr" for c in configs)
    kv = KVPool.start(KVPoolConfig(capacity_bytes=s.kv_pool_bytes), out / "kvpool") if s.kv_pool else None
    dgds = DgdsServer("127.0.0.1", 0).start() if want_sd else None
    prio = any(dict(c.sched).get("engine_priority") for c in configs)  # instances with priority scheduling
    try:
        pooled = kv.configure if kv is not None else (lambda spec: spec)
        plain_specs = instance_specs(s, model_dir, cores, priority=prio) if want_plain else []
        pool_specs = [pooled(x) for x in instance_specs(s, model_dir, cores, prefix="pool-inst", priority=prio)
                      ] if want_pooled else []
        spec_flag = speculative_config(s.spec_tokens)
        sd_specs = [pooled(x) for x in instance_specs(
            s, model_dir, cores, prefix="sd-inst", extra_args=("--speculative-config", spec_flag, *EXECUTOR_ARGS),
            env={"SEER_DGDS_ADDRESS": dgds.address}, priority=prio)] if want_sd else []
        return _run_on_instances(s, configs, prompts, hidden, out, plain_specs, pool_specs, sd_specs, progress)
    finally:
        if dgds is not None:
            dgds.stop(0.5)
        if kv is not None:
            kv.close()


def _run_on_instances(s: CompareSettings, configs: list[BenchConfig], prompts: list[PromptSpec], hidden,
                      out: Path, plain_specs: list, pool_specs: list, sd_specs: list, progress) -> dict:
    """Start the instance sets, warm each up, run every configuration of every repeat, write the results."""
    from seer.fleet.pool import InstancePool

    t0 = time.monotonic()
    kinds = [k for k, specs in (("plain", plain_specs), ("on the KV pool", pool_specs), ("speculative", sd_specs)) if specs]
    progress(f"starting {len(plain_specs) + len(pool_specs) + len(sd_specs)} vLLM instances ({' + '.join(kinds)})")
    runs: list[ConfigRun] = []
    with InstancePool.launch(plain_specs + pool_specs + sd_specs, out / "logs") as pool:
        progress(f"instances ready in {time.monotonic() - t0:.0f} s")
        n_plain, n_pool = len(plain_specs), len(pool_specs)
        plain, pooled = pool.clients[:n_plain], pool.clients[n_plain:n_plain + n_pool]
        sd = pool.clients[n_plain + n_pool:]

        def clients_for(cfg: BenchConfig) -> tuple[list, bool]:
            """The instances `cfg` runs on, and whether they share the KV pool."""
            if cfg.speculate:
                return sd, s.kv_pool
            if pooled and cfg.policy != "group_rr":
                return pooled, True
            return plain, False

        prompt_lens = {g: len(p.prompt_ids) for g, p in enumerate(prompts)}

        def backends(clients):
            return [TraceBackend(c, hidden, prompt_lens) for c in clients] if hidden else list(clients)

        async def go():
            try:
                nonlocal hidden
                # An untimed warm-up on each instance set; the first also samples the lengths.
                sets = [(name, c, shared) for name, c, shared in
                        (("warm-", plain, False), ("warmpool-", pooled, True), ("warmsd-", sd, s.kv_pool)) if c]
                warm = BenchConfig("warmup", "divided")
                for k, (name, c, shared) in enumerate(sets):
                    _, _, got = await run_one(backends(c), c, warm, prompts, s, name, kv_pool=shared)
                    if k == 0:
                        lengths = got
                        if s.mode == "replay":  # the model's own lengths, from now on the same in every run
                            hidden = lengths
                            progress(f"replaying the warm-up's lengths: {sum(lengths.values())} tokens, longest "
                                     f"{max(lengths.values())}, median {sorted(lengths.values())[len(lengths) // 2]}")
                true_lengths = hidden or lengths  # the oracle's "previous run"
                for rep in range(s.repeats):
                    order = configs if rep % 2 == 0 else configs[::-1]
                    for pos, cfg in enumerate(order):
                        clients, shared = clients_for(cfg)
                        stats, mal, lens = await run_one(backends(clients), clients, cfg, prompts, s,
                                                         f"r{rep}-{cfg.name}-", true_lengths, kv_pool=shared)
                        runs.append(ConfigRun(cfg.name, rep, pos, stats, mal,
                                              {f"{g}-{k}": v for (g, k), v in lens.items()}))
                        progress(f"repeat {rep} {cfg.name:10s} {stats.tokens_per_s:8.1f} tok/s  wall "
                                 f"{stats.wall_s:6.1f} s  tail {stats.tail_s:5.1f} s  preemptions {stats.preemptions}"
                                 + (f"  acceptance {mal:.2f}" if mal else ""))
                        if s.verbose:
                            progress(format_breakdown(cfg.name, stats.extra["breakdown"]))
            finally:
                await pool.aclose_clients()

        asyncio.run(go())
    return write(s, configs, runs, out, time.monotonic() - t0)


def write(s: CompareSettings, configs: list[BenchConfig], runs: list[ConfigRun], out: Path, elapsed_s: float) -> dict:
    """compare.json, compare.md and the PNGs of a finished comparison."""
    result = summarize(s, configs, runs)
    result["elapsed_s"] = elapsed_s
    (out / "compare.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "compare.md").write_text(markdown(result) + "\n\nWhere the time went (bench.harness.breakdown):\n\n"
                                    + breakdown_markdown(result) + "\n")
    plot(result, runs, out)
    return result


def render(out: Path) -> dict:
    """Rewrite compare.md, the PNGs and the summary of `out/compare.json` with this code (no rerun)."""
    old = json.loads((out / "compare.json").read_text())
    s = CompareSettings(**{k: v for k, v in old["settings"].items() if k in CompareSettings.__dataclass_fields__})
    runs = []
    for r in old["runs"]:
        st = dict(r["stats"])
        st["instances"] = [InstanceStats(**i) for i in st["instances"]]
        runs.append(ConfigRun(r["config"], r["repeat"], r["position"], IterationStats(**st),
                              r.get("mean_acceptance_length"), r.get("lengths", {})))
    return write(s, select(s.configs), runs, out, old.get("elapsed_s", 0.0))


def summarize(s: CompareSettings, configs: list[BenchConfig], runs: list[ConfigRun]) -> dict:
    """Per configuration: mean and spread over repeats, and ratios to the baseline of the same repeat."""
    base = {r.repeat: r.stats.tokens_per_s for r in runs if r.config == "baseline"}
    rows = {}
    for cfg in configs:
        mine = [r for r in runs if r.config == cfg.name]
        tps = [r.stats.tokens_per_s for r in mine]
        ratios = [r.stats.tokens_per_s / base[r.repeat] for r in mine if r.repeat in base]
        mal = [r.mean_acceptance_length for r in mine if r.mean_acceptance_length is not None]
        rows[cfg.name] = {
            "label": cfg.label,
            "tokens_per_s": statistics.mean(tps),
            "tokens_per_s_min": min(tps),
            "tokens_per_s_max": max(tps),
            "ratio": statistics.mean(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "wall_s": statistics.mean(r.stats.wall_s for r in mine),
            "tail_s": statistics.mean(r.stats.tail_s for r in mine),
            "tail_s_min": min(r.stats.tail_s for r in mine),
            "tail_s_max": max(r.stats.tail_s for r in mine),
            "idle_fraction": statistics.mean(statistics.mean(i.idle_fraction for i in r.stats.instances) for r in mine),
            "idle_fraction_per_instance": [statistics.mean(r.stats.instances[k].idle_fraction for r in mine)
                                           for k in range(len(mine[0].stats.instances))],
            "preemptions": statistics.mean(r.stats.preemptions for r in mine),
            "chunks_dispatched": statistics.mean(r.stats.extra.get("chunks_dispatched", 0) for r in mine),
            "chunks_migrated": statistics.mean(r.stats.extra.get("chunks_migrated", 0) for r in mine),
            "migrated_prefix_tokens_cached": statistics.mean(r.stats.extra.get("migrated_prefix_tokens_cached", 0) for r in mine),
            "output_tokens": statistics.mean(r.stats.output_tokens for r in mine),
            "mean_acceptance_length": statistics.mean(mal) if mal else None,
        }
    return {
        "bench": "compare", "settings": asdict(s), "machine": platform.platform(), "cpus": os.cpu_count(),
        "command": command_line(s),
        # each configuration's scheduler settings, so a replay (bench.sim.replay_compare) runs what ran here
        "config_sched": {c.name: dict(c.sched) for c in configs},
        "configs": rows,
        "runs": [{"config": r.config, "repeat": r.repeat, "position": r.position, "stats": asdict(r.stats),
                  "mean_acceptance_length": r.mean_acceptance_length, "lengths": r.lengths} for r in runs],
    }


def command_line(s: CompareSettings) -> str:
    """The shortest command that reproduces `s`: its preset, then the flags that differ from it."""
    base = preset_defaults(s.preset)
    preset = s.preset or "tiny"  # "": the dataclass defaults, which --preset tiny names
    flags = [] if preset == DEFAULT_PRESET else [f"--preset {preset}"]
    flags += [f"--{k.replace('_', '-')} {v}" for k, v in asdict(s).items()
              if k != "preset" and v != getattr(base, k)]
    return " ".join(["python -m bench.compare", *flags])


def tail_range(row: dict) -> str:
    """' (min-max)' of the tail time over repeats; empty for rows summarized before it was recorded."""
    if "tail_s_min" not in row:
        return ""
    return f" ({row['tail_s_min']:.1f}-{row['tail_s_max']:.1f})"


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        f"`{result['command']}` ({s['mode']} mode, model `{s['model']}`, {s['groups']} groups x G={s['group_size']}, "
        f"max {s['max_tokens']} tokens, chunk {s['chunk_size']}, {s['instances']} instances x 1 core, "
        f"KV pool {'on (chunked configurations)' if s.get('kv_pool') else 'off'}, "
        f"{s['repeats']} repeats, order alternating; {result.get('elapsed_s', 0):.0f} s in all)",
        "",
        "| configuration | output tok/s (min-max) | vs baseline (min-max) | wall s | tail s (min-max) | idle | preemptions | chunks (migrated) | output tokens | acceptance length |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["configs"].items():
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        mal = "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
        lines.append(
            f"| {r['label']} | {r['tokens_per_s']:.0f} ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}) | {ratio} | "
            f"{r['wall_s']:.1f} | {r['tail_s']:.1f}{tail_range(r)} | {r['idle_fraction']:.0%} | {r['preemptions']:.0f} | "
            f"{r['chunks_dispatched']:.0f} ({r['chunks_migrated']:.0f}) | {r['output_tokens']:.0f} | {mal} |"
        )
    return "\n".join(lines)


def longest_cell(bs: list[dict]) -> str:
    lrs = [b["total"]["longest_request"] for b in bs if b["total"].get("longest_request")]
    if not lrs:
        return "-"
    m = lambda k: statistics.mean(lr[k] for lr in lrs)  # noqa: E731
    return f"{m('first_dispatch_s'):.1f} / {m('finish_s'):.1f} ({m('between_chunks_s'):.1f})"


def breakdown_markdown(result: dict) -> str:
    """Where each configuration's time went (bench.harness.breakdown), mean over repeats, from the runs'
    stats: works on a fresh result and on a loaded compare.json alike."""
    lines = [
        "| configuration | busy | chunks in flight per instance | engine steps (max instance) | ms/step | "
        "prefill computed / prompt tokens | chunk HTTP+API overhead ms | scheduler gap ms mean (p90) | preemptions | "
        "longest request: first dispatch / done s (between chunks s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["configs"].items():
        bs = [r["stats"]["extra"]["breakdown"] for r in result["runs"]
              if r["config"] == name and "breakdown" in r["stats"].get("extra", {})]
        if not bs:
            continue

        def mean(f):
            return statistics.mean(f(b) for b in bs)

        inst = lambda b: list(b["instances"].values())  # noqa: E731
        lines.append(
            f"| {row['label']} | {mean(lambda b: b['total']['busy_fraction']):.0%} | "
            f"{mean(lambda b: statistics.mean(i['concurrency'] for i in inst(b))):.0f} | "
            f"{mean(lambda b: max(i['engine_steps'] for i in inst(b))):.0f} | "
            f"{mean(lambda b: statistics.mean(i['ms_per_step'] for i in inst(b))):.1f} | "
            f"{mean(lambda b: b['total']['prefill_tokens_computed']):.0f} / {mean(lambda b: b['total']['prompt_tokens']):.0f} | "
            f"{mean(lambda b: b['total']['http_overhead_ms_per_chunk']):.0f} | "
            f"{mean(lambda b: b['total']['gap_mean_ms']):.0f} ({mean(lambda b: b['total']['gap_p90_ms']):.0f}) | "
            f"{mean(lambda b: b['total']['preemptions']):.0f} | {longest_cell(bs)} |"
        )
    return "\n".join(lines)


def plot(result: dict, runs: list[ConfigRun], out: Path) -> None:
    """Throughput bars with the spread over repeats; KV usage and running requests per instance over time."""
    throughput_bars(result["configs"], out / "throughput.png", "output tokens/s", "rollout throughput per configuration",
                    lambda r: "" if r["ratio"] is None else f"{r['ratio']:.2f}x")
    timeline_plot([(r.config, r.stats.extra.get("kv_timeline", [])) for r in runs if r.repeat == 0],
                  out / "timelines.png")


def timeline_plot(series: list[tuple[str, list[dict]]], path: Path) -> None:
    """One column per configuration: KV usage (top) and running requests (bottom), one line per instance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(series), figsize=(3.2 * len(series), 5), squeeze=False, sharey="row")
    for col, (name, tl) in enumerate(series):
        for inst in sorted({p["instance"] for p in tl}):
            pts = [p for p in tl if p["instance"] == inst]
            t = [p["t"] for p in pts]
            axes[0][col].plot(t, [p["kv_usage"] for p in pts], label=inst, lw=1)
            axes[1][col].plot(t, [p["running"] for p in pts], label=inst, lw=1)
        axes[0][col].set_title(name)
        axes[1][col].set_xlabel("s")
    axes[0][0].set_ylabel("KV usage")
    axes[1][0].set_ylabel("running requests")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def preset_defaults(preset: str) -> CompareSettings:
    """The settings a `--preset` starts from (flags given next to it override them)."""
    if preset and preset not in PRESETS:
        raise ValueError(f"unknown --preset {preset!r}; known: {sorted(PRESETS)}")
    return CompareSettings(**{**PRESETS.get(preset, {}), "preset": preset})


def parse(argv: list[str] | None) -> CompareSettings:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=DEFAULT_PRESET)
    known, _ = pre.parse_known_args(argv)
    if known.preset and known.preset not in PRESETS:
        pre.error(f"unknown --preset {known.preset!r}; known: {sorted(PRESETS)}")
    d = preset_defaults(known.preset)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    notes = field_comments(CompareSettings)  # each flag's help is its field's comment
    for f, v in asdict(d).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=parse_bool if isinstance(v, bool) else type(v), default=v,
                        help=notes[f].replace("%", "%%") + " (default: %(default)s)",
                        **({"choices": ["", *PRESETS]} if f == "preset" else {}))
    return CompareSettings(**vars(ap.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    return run_command(argv, parse, run, markdown, render)


if __name__ == "__main__":
    raise SystemExit(main())
