"""Is speculative sampling lossless on this vLLM? Calibration of sampled tokens at temperature 1.0.

    python bench/dgds_sampling_check.py [--model tiny] [--prompts 8] [--samples 8] [--max-tokens 128]

One vLLM CPU instance per mode, one after the other, same prompts:
  * uncorrected   the DGDS proposer drafting (6 tokens, fixed lengths), SEER_VLLM_CPU_FIX=0
  * corrected     the same with seer.compat.vllm_cpu_fixes applied (the default)
  * none          no speculation
vLLM returns the top-20 target logprobs of every position with its sampled token; if sampling
follows the target distribution, the fraction of tokens of rank r matches the mean reported
probability of rank r (the z column: observed minus expected, in standard deviations). Padding ids
are ids beyond the tokenizer (never-trained rows of the padded lm_head). See docs/dgds.md.
Writes bench/results/dgds_sampling_check/dgds_sampling_check.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path

from seer.dgds.vllm import speculative_config
from seer.request_ids import request_id

BUCKETS = [(1, 1), (2, 2), (3, 5), (6, 20)]  # ranks; the last column is "beyond the top 20"
NAMES = ["rank 1", "rank 2", "ranks 3-5", "ranks 6-20", "beyond 20"]


def calibration(choices: list[dict], n_real: int) -> dict:
    tokens = padding = 0
    observed, mean, var = [0] * 5, [0.0] * 5, [0.0] * 5
    for ch in choices:
        for tok, top in zip(ch["token_ids"], ch["logprobs"]["top_logprobs"]):
            tokens += 1
            padding += tok >= n_real
            ranked = sorted(((lp, int(k.split(":")[1])) for k, lp in top.items()), reverse=True)[:20]
            ids = [t for _, t in ranked]
            rank = ids.index(tok) + 1 if tok in ids else 21
            probs = [math.exp(lp) for lp, _ in ranked]
            ps = [sum(probs[lo - 1 : hi]) for lo, hi in BUCKETS] + [max(0.0, 1.0 - sum(probs))]
            for b, p in enumerate(ps):
                mean[b] += p
                var[b] += p * (1 - p)
                observed[b] += (BUCKETS[b][0] <= rank <= BUCKETS[b][1]) if b < 4 else rank == 21
    return {"tokens": tokens, "padding_ids": padding,
            "buckets": [{"name": n, "observed": o / tokens, "expected": m / tokens,
                         "z": (o - m) / math.sqrt(v) if v > 0 else 0.0}
                        for n, o, m, v in zip(NAMES, observed, mean, var)]}


def run_mode(mode: str, model: str, prompts, args, log_dir: Path) -> dict:
    from seer.fleet.instance import InstanceSpec
    from seer.procs import free_port
    from seer.fleet.pool import InstancePool

    extra, env = (), {}
    if mode != "none":
        extra = ("--speculative-config", speculative_config(6))
        env = {"SEER_DGDS_ADAPTIVE": "0", "SEER_VLLM_CPU_FIX": "0" if mode == "uncorrected" else "1"}
    spec = InstanceSpec(f"check-{mode}", model, free_port(), cpus="0", max_model_len=1024,
                        kv_cache_bytes=96 * 2**20, max_num_seqs=64, extra_args=extra, env=env)
    pool = InstancePool.launch([spec], log_dir, ready_timeout_s=900)

    async def sample():
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async def one(p, k):
                body = {"model": "seer-policy", "prompt": list(p.prompt_ids), "max_tokens": args.max_tokens,
                        "temperature": 1.0, "ignore_eos": True, "return_token_ids": True,
                        "skip_special_tokens": False, "logprobs": 20, "return_tokens_as_token_ids": True}
                async with http.post(f"{spec.url}/v1/completions", json=body,
                                     headers={"X-Request-Id": request_id(p.index, k, "check-")}) as r:
                    return (await r.json())["choices"][0]
            return await asyncio.gather(*(one(p, k) for p in prompts for k in range(args.samples)))

    try:
        return asyncio.run(sample())
    finally:
        pool.close()


def markdown(res: dict) -> str:
    cfg = res["config"]
    lines = [f"{cfg['prompts']} prompts x {cfg['samples']} samples x {cfg['max_tokens']} tokens of `{cfg['model']}`, "
             f"temperature 1.0; speculation: DGDS proposer, 6 drafted tokens per step. "
             f"Observed fraction of tokens by rank in the target distribution (expected; z).\n",
             "| mode | tokens | padding ids | " + " | ".join(NAMES) + " |",
             "|---|---|---|" + "---|" * len(NAMES)]
    for mode, r in res["modes"].items():
        cells = [f"{b['observed']:.3f} ({b['expected']:.3f}; {b['z']:+.1f})" for b in r["buckets"]]
        lines.append(f"| {mode} | {r['tokens']} | {r['padding_ids']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="an embedded preset or a local HF checkpoint directory")
    ap.add_argument("--prompts", type=int, default=8, help="prompts of the built-in task")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per sample")
    ap.add_argument("--modes", default="uncorrected,corrected,none", help="comma-separated modes (uncorrected, corrected, none)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dgds_sampling_check", help="where the JSON and markdown go")
    args = ap.parse_args(argv)

    import tempfile

    from transformers import AutoTokenizer

    from seer.model import ensure_model
    from seer.tasks import TaskConfig, encode_prompts, load_task

    model = str(ensure_model(args.model, progress=False))
    tok = AutoTokenizer.from_pretrained(model)
    prompts = encode_prompts(load_task(TaskConfig(num_prompts=args.prompts, seed=3)).records, tok, 1024)
    res = {"config": {"model": args.model, "prompts": args.prompts, "samples": args.samples,
                      "max_tokens": args.max_tokens}, "modes": {}}
    logs = Path(tempfile.mkdtemp(prefix="dgds-sampling-check-"))
    for mode in args.modes.split(","):
        res["modes"][mode] = calibration(run_mode(mode, model, prompts, args, logs), len(tok))
        print(mode, json.dumps(res["modes"][mode]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dgds_sampling_check.json").write_text(json.dumps(res, indent=2))
    md = markdown(res)
    (args.out / "dgds_sampling_check.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
