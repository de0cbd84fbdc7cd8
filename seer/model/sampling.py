"""Sampling from a checkpoint with plain HF generate, for measurements without vLLM.

Why not vLLM here: measuring the warm-started model (initial reward, sampled lengths) should
work in a test or at build time without starting a server; HF generate is slow but enough for
a few hundred samples of a 3M-parameter model.
"""

from __future__ import annotations

import os

import torch


def sample_responses(
    model_dir: str | os.PathLike,
    prompts: list[list[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    rows_per_batch: int = 64,
    threads: int = 2,
) -> list[list[list[int]]]:
    """`n` sampled responses (token ids, EOS stripped) per prompt, in prompt order."""
    from transformers import AutoModelForCausalLM

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        eos, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
        pad = eos if pad is None else pad
        torch.manual_seed(seed)
        per_batch = max(1, rows_per_batch // n)
        out: list[list[list[int]]] = []
        for start in range(0, len(prompts), per_batch):
            chunk = prompts[start : start + per_batch]
            width = max(len(p) for p in chunk)
            rows = [p for p in chunk for _ in range(n)]
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
            with torch.no_grad():
                gen = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
            for g in range(len(chunk)):
                group = []
                for row in gen[g * n : (g + 1) * n, width:].tolist():
                    group.append(row[: row.index(eos)] if eos in row else row)
                out.append(group)
        return out
    finally:
        torch.set_num_threads(old_threads)
