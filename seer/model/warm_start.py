"""Supervised warm start of the embedded model on reference traces of the default task.

Why: a randomly initialised model never finishes a trace, so every GRPO group would score the
same and there would be no signal. A short, deliberately under-trained run teaches the format,
the stopping rule and most of the arithmetic, leaving slips for RL to fix. Plain PyTorch on CPU,
seeded, with a fixed thread count so that a rebuild reproduces the same weights.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from seer.model.presets import WarmStartSpec
from seer.tasks import calculator
from seer.tasks.running_sum import generate_problems, restated_start_line, solve

IGNORE = -100


@dataclass(frozen=True)
class WarmStartReport:
    steps: int
    examples: int
    tokens: int  # padded tokens processed
    first_loss: float
    final_loss: float  # mean of the last 10% of steps
    seconds: float


@dataclass(frozen=True)
class _Example:
    input_ids: list[int]
    prompt_len: int
    trained: tuple[int, ...] | None = None  # per token, 1 where the loss applies (None: the response)


def _examples(spec: WarmStartSpec, tokenizer) -> list[_Example]:
    if isinstance(spec.task, calculator.CalcTaskConfig):
        return _calc_examples(spec, tokenizer)
    problems = generate_problems(dataclasses.replace(spec.task, num_prompts=spec.train_prompts))
    rng = random.Random(f"warm_start:{spec.seed}")
    restate_rng = random.Random(f"restate:{spec.seed}")
    out = []
    for p in problems:
        prompt = tokenizer(p.text)["input_ids"]
        text = solve(p.reference, rng)
        if restate_rng.random() < spec.restate_fraction:
            text = restated_start_line(p.reference) + text
        response = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(_Example(prompt + response + [tokenizer.eos_token_id], len(prompt)))
    return out


def _calc_examples(spec: WarmStartSpec, tokenizer) -> list[_Example]:
    """Calculator trajectories: the loss covers the model's turns and EOS, not the calculator's
    answers (masked as the prompt is), as GRPO's loss mask will."""
    problems = calculator.generate_problems(dataclasses.replace(spec.task, num_prompts=spec.train_prompts))
    rng = random.Random(f"warm_start:{spec.seed}")
    restate_rng = random.Random(f"restate:{spec.seed}")
    out = []
    for p in problems:
        ids = list(tokenizer(p.text)["input_ids"])
        trained = [0] * len(ids)
        turns = calculator.solve(p.reference, rng)
        if restate_rng.random() < spec.restate_fraction:
            turns[0] = (calculator.restated_start_line(p.reference) + turns[0][0], turns[0][1])
        for turn, obs in turns:
            t = tokenizer(turn, add_special_tokens=False)["input_ids"] if turn else []
            o = tokenizer(obs, add_special_tokens=False)["input_ids"] if obs else []
            ids += t + o
            trained += [1] * len(t) + [0] * len(o)
        ids.append(tokenizer.eos_token_id)
        trained.append(1)
        out.append(_Example(ids, len(tokenizer(p.text)["input_ids"]), tuple(trained)))
    return out


WIDTHS = (128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096)


def _batches(examples: list[_Example], tokens_per_batch: int, seed: int) -> list[list[_Example]]:
    """Length-bucketed batches of a few fixed shapes, in a seeded order.

    Bucketing keeps padding small despite the heavy tail; fixed (rows, width) shapes matter on
    CPU because every new tensor shape costs oneDNN set-up that is slower than the step itself.
    A bucket's last batch is topped up with its first examples so it keeps the bucket's shape.
    """
    buckets: dict[int, list[_Example]] = {}
    for ex in examples:
        width = next((w for w in WIDTHS if w >= len(ex.input_ids)), len(ex.input_ids))
        buckets.setdefault(width, []).append(ex)
    batches = []
    for width, group in sorted(buckets.items()):
        rows = max(1, tokens_per_batch // width)
        for i in range(0, len(group), rows):
            batch = group[i : i + rows]
            batch += group[: rows - len(batch)]
            batches.append(batch)
    random.Random(f"batches:{seed}").shuffle(batches)
    return batches


def _collate(batch: list[_Example], pad_id: int) -> dict[str, torch.Tensor]:
    longest = max(len(e.input_ids) for e in batch)
    width = next((w for w in WIDTHS if w >= longest), longest)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, e.prompt_len : n] = ids[i, e.prompt_len : n]  # loss on the response and EOS only
        if e.trained is not None:
            labels[i, :n][torch.tensor(e.trained) == 0] = IGNORE
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def warm_start(model: torch.nn.Module, tokenizer, spec: WarmStartSpec, *, progress: bool = True) -> WarmStartReport:
    """Train `model` in place for `spec.steps` steps over the spec's generated traces (at most one pass)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    try:
        examples = _examples(spec, tokenizer)
        batches = _batches(examples, spec.tokens_per_batch, spec.seed)
        if len(batches) < spec.steps:
            raise ValueError(f"warm start: {spec.train_prompts} prompts fill {len(batches)} batches, fewer than {spec.steps} steps")
        steps = spec.steps
        batches = batches[:steps]
        warmup = max(1, int(spec.warmup_fraction * steps))
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.98))

        def lr_at(step: int) -> float:
            if step < warmup:
                return spec.lr * (step + 1) / warmup
            t = (step - warmup) / max(1, steps - warmup)
            return spec.lr * (spec.min_lr_fraction + (1 - spec.min_lr_fraction) * 0.5 * (1 + math.cos(math.pi * t)))

        model.train()
        losses: list[float] = []
        tokens = 0
        t0 = time.monotonic()
        bar = Progress(
            TextColumn("[bold]warm start[/bold]"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps  loss {task.fields[loss]:.3f}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not progress,
            transient=False,
        )
        with bar:
            task = bar.add_task("train", total=steps, loss=float("nan"))
            for step, batch in enumerate(batches):
                for group in opt.param_groups:
                    group["lr"] = lr_at(step)
                inputs = _collate(batch, tokenizer.pad_token_id)
                loss = model(**inputs).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
                tokens += inputs["input_ids"].numel()
                bar.update(task, advance=1, loss=losses[-1])
                if progress and not bar.console.is_terminal and (step + 1) % max(1, steps // 10) == 0:
                    # a log file sees nothing of a live bar until it stops: print milestones instead
                    bar.console.print(f"warm start {step + 1}/{steps} steps, loss {losses[-1]:.3f}, {time.monotonic() - t0:.0f} s")
        model.eval()
        tail = losses[-max(1, steps // 10) :]
        return WarmStartReport(
            steps=steps,
            examples=len(examples),
            tokens=tokens,
            first_loss=losses[0],
            final_loss=sum(tail) / len(tail),
            seconds=time.monotonic() - t0,
        )
    finally:
        torch.set_num_threads(threads)
