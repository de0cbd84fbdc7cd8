"""The vLLM instances the comparisons start, and the command-line shape and plot they share."""

from __future__ import annotations

from pathlib import Path


def instance_specs(s, model_dir: Path, cores: list[str], prefix: str = "inst",
                   extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                   priority: bool = False) -> list:
    """The benchmark's vLLM instances, one per core set, as `s` sizes them (any settings with
    max_model_len, kv_cache_bytes, max_num_seqs and seed: bench.compare's, bench.multiturn_compare's).

    Dev mode: /reset_prefix_cache between runs. No chunked prefill: vLLM 0.32's CPU backend fails
    on seeded requests whose prefill is split over steps. (A step budget as large as
    max_num_seqs x max_model_len did the same, but vLLM's start-up profiles a batch of that many
    tokens, which runs out of memory for the default model with 256 sequences.)
    """
    from seer.fleet.instance import InstanceSpec
    from seer.procs import free_port

    batched = ("--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(8192, s.max_model_len)))
    return [InstanceSpec(f"{prefix}{i}", str(model_dir), free_port(), cpus=c, max_model_len=s.max_model_len,
                         kv_cache_bytes=s.kv_cache_bytes, max_num_seqs=s.max_num_seqs, seed=s.seed,
                         weight_sync=False, env={"VLLM_SERVER_DEV_MODE": "1", **(env or {})},
                         extra_args=(*batched, *extra_args), scheduling_policy="priority" if priority else "fcfs")
            for i, c in enumerate(cores)]


def throughput_bars(rows: dict[str, dict], path: Path, ylabel: str, title: str, note, headroom: float = 1.12) -> None:
    """Bars of each row's `tokens_per_s` with whiskers from its min to max over repeats, `note(row)`
    written above each whisker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    means = [rows[n]["tokens_per_s"] for n in names]
    err = [[m - rows[n]["tokens_per_s_min"] for m, n in zip(means, names)],
           [rows[n]["tokens_per_s_max"] - m for m, n in zip(means, names)]]
    ax.bar(names, means, yerr=err, capsize=4, color="tab:blue")
    for i, n in enumerate(names):
        ax.text(i, rows[n]["tokens_per_s_max"], note(rows[n]), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, headroom * max(rows[n]["tokens_per_s_max"] for n in names))  # room for the labels
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n(bars: mean, whiskers: min-max over repeats)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_command(argv: list[str] | None, parse, run, markdown, render) -> int:
    """A comparison's command line: `--render DIR` re-summarizes a saved run, else parse the flags,
    run, print the table (bench.compare, bench.multiturn_compare)."""
    if argv is None:
        import sys

        argv = sys.argv[1:]
    if argv[:1] == ["--render"]:
        print(markdown(render(Path(argv[1]))))
        return 0
    result = run(parse(argv), progress=lambda m: print(m, flush=True))
    print(markdown(result))
    return 0
