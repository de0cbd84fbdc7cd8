"""Measures a task's response-length distribution: the long tail Seer exists for.

Run `python -m bench.task_lengths` for the built-in task's table: lengths of reference
solutions over the whole default dataset, and, unless `--model none`, lengths and rewards of
responses sampled from the warm-started default model (HF generate on a few prompts).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthStats:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    icc: float  # intraclass correlation of lengths within groups (one-way ICC(1))
    icc_log: float  # the same on log lengths: less dominated by the few longest groups

    @property
    def tail_ratio(self) -> float:
        return self.p99 / self.p50 if self.p50 > 0 else float("inf")


def intraclass_correlation(groups: Sequence[Sequence[float]]) -> float:
    """ICC(1) from a one-way ANOVA: the share of length variance explained by the prompt.

    Needs equal group sizes >= 2; nan when undefined (a single group, or no variance at all).
    """
    x = np.asarray(groups, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        return float("nan")
    g, k = x.shape
    means = x.mean(axis=1)
    msb = k * ((means - x.mean()) ** 2).sum() / (g - 1)
    msw = ((x - means[:, None]) ** 2).sum() / (g * (k - 1))
    denom = msb + (k - 1) * msw
    return float((msb - msw) / denom) if denom > 0 else float("nan")


def length_stats(groups: Sequence[Sequence[int]]) -> LengthStats:
    flat = np.asarray([n for g in groups for n in g], dtype=float)
    if flat.size == 0:
        raise ValueError("no lengths")
    sizes = {len(g) for g in groups}
    icc = icc_log = float("nan")
    if len(sizes) == 1:
        icc = intraclass_correlation(groups)
        icc_log = intraclass_correlation([[np.log1p(n) for n in g] for g in groups])
    return LengthStats(
        count=int(flat.size),
        mean=float(flat.mean()),
        p50=float(np.percentile(flat, 50)),
        p90=float(np.percentile(flat, 90)),
        p99=float(np.percentile(flat, 99)),
        max=int(flat.max()),
        icc=icc,
        icc_log=icc_log,
    )


def reference_lengths(prompts: int, group_size: int, seed: int = 0) -> list[list[int]]:
    """Token lengths (with EOS) of `group_size` independent reference solutions per prompt."""
    from seer.tasks.running_sum import RunningSumConfig, generate_problems, solve

    rng = random.Random(f"reference_lengths:{seed}")
    problems = generate_problems(RunningSumConfig(num_prompts=prompts, seed=seed))
    # one token per character with the embedded tokenizer, plus EOS
    return [[len(solve(p.reference, rng)) + 1 for _ in range(group_size)] for p in problems]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.task_lengths", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=256, help="prompts of the built-in dataset (default config: 256)")
    ap.add_argument("--group-size", type=int, default=8, help="reference solutions per prompt (G)")
    ap.add_argument("--seed", type=int, default=0, help="the built-in dataset's seed")
    ap.add_argument("--model", default="default", help="preset, checkpoint dir, or 'none' to skip sampling")
    ap.add_argument("--model-prompts", type=int, default=32, help="prompts the model samples responses for")
    ap.add_argument("--model-group-size", type=int, default=4, help="model samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=2048, help="longest model response, in tokens")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    rows: list[tuple[str, LengthStats, str]] = []
    ref = length_stats(reference_lengths(args.prompts, args.group_size, args.seed))
    rows.append((f"reference solutions ({args.prompts}x{args.group_size})", ref, "1.000"))

    if args.model != "none":
        from seer.model import resolve_model
        from seer.model.sampling import sample_responses
        from seer.tasks.dataset import TaskConfig, encode_prompts, load_task, max_context_of
        from transformers import AutoTokenizer

        path = resolve_model(args.model)
        tok = AutoTokenizer.from_pretrained(path)
        task = load_task(TaskConfig(num_prompts=args.prompts, seed=args.seed))
        picked = random.Random(f"model_prompts:{args.seed}").sample(task.records, min(args.model_prompts, len(task.records)))
        picked.sort(key=lambda r: r.reference["steps"])  # similar lengths per generate batch: less waiting on one long row
        specs = encode_prompts(picked, tok, max_context_of(path))
        t0 = time.monotonic()
        samples = sample_responses(
            path, [s.prompt_ids for s in specs], n=args.model_group_size, max_new_tokens=args.max_new_tokens, seed=args.seed
        )
        elapsed = time.monotonic() - t0
        rewards = [
            task.reward_fn(tok.decode(r, skip_special_tokens=True), s.reference) for s, g in zip(specs, samples) for r in g
        ]
        # +1 counts the EOS that finished responses end with, as for the references
        lens = [[len(r) + (len(r) < args.max_new_tokens) for r in g] for g in samples]
        rows.append(
            (f"model {args.model} ({len(specs)}x{args.model_group_size}, {elapsed:.0f} s)", length_stats(lens), f"{np.mean(rewards):.3f}")
        )

    table = Table(title="Response length in tokens (built-in running_sum task)")
    for col in ("source", "n", "mean", "p50", "p90", "p99", "max", "p99/p50", "ICC", "ICC(log)", "reward"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for name, s, reward in rows:
        table.add_row(
            name, str(s.count), f"{s.mean:.0f}", f"{s.p50:.0f}", f"{s.p90:.0f}", f"{s.p99:.0f}", str(s.max),
            f"{s.tail_ratio:.1f}", f"{s.icc:.2f}", f"{s.icc_log:.2f}", reward,
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
