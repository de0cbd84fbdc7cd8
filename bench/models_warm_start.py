"""Offset heads on the families without q/k biases: the warm start's loss with and without them.

Builds the tiny preset's architecture and warm start (500 supervised steps on the running-sum
traces) as each family (Qwen2, Qwen3 with QK-norm, Llama 3 with its RoPE scaling), once with the
offset-head prior (seer/model/offset_heads.py: q/k biases for Qwen2, a constant embedding channel
for the others) and once without, and records each build's first and final loss. It measures the
supervised warm start only, not learning under GRPO (that needs a run against an lr=0 control).

    python -m bench.models_warm_start [--families qwen2,qwen3,llama3] [--out bench/results/models/warm_start]   (seer-bench models-warm-start)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAMILIES = ("qwen2", "qwen3", "llama3")
# Llama 3 at its released RoPE base and at the `llama3` preset's (both with Llama 3.1's scaling):
# the preset's warm start left reward 0 at 500000 (docs/models.md, Measured).
LLAMA3_THETAS = {"llama3": 10000.0, "llama3-theta500k": 500000.0}


def build(family: str, offsets: bool) -> dict:
    from seer.model.build import build_model
    from seer.model.presets import PRESETS, ModelPreset

    tiny = PRESETS["tiny"]
    extra = {}
    if family in LLAMA3_THETAS:
        extra = {"rope_theta": LLAMA3_THETAS[family], "llama3_rope": PRESETS["llama3"].arch.llama3_rope}
    arch = dataclasses.replace(tiny.arch, family=family.split("-")[0], **extra)
    ws = tiny.warm_start if offsets else dataclasses.replace(tiny.warm_start, offset_heads=())
    with tempfile.TemporaryDirectory() as d:
        build_model(ModelPreset(name=f"tiny-{family}", arch=arch, warm_start=ws), d, progress=False)
        info = json.loads((Path(d) / "seer_build.json").read_text())
    return {"family": family, "rope_theta": arch.rope_theta, "offset_heads": list(ws.offset_heads), **info["warm_start"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results/models/warm_start", help="folder for the .json and .md")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help=f"comma-separated, of {', '.join(FAMILIES)}, llama3-theta500k")
    args = p.parse_args(argv)
    rows = [build(f, o) for f in args.families.split(",") for o in (True, False)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python -m bench.models_warm_start" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    doc = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "commit": commit, "machine": f"{platform.machine()}, 2 threads (the warm start's fixed count)",
           "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "models_warm_start.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Warm start per family, with and without offset heads", "",
             f"`{doc['command']}` at {commit}, {doc['date']}. The tiny preset's sizes (hidden 64, 2 layers, "
             "2 heads of 32) and warm start (500 steps); final loss = mean of the last 10% of steps.", "",
             "| family | RoPE theta | offset heads | first loss | final loss | seconds |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['rope_theta']:g} | {'yes' if r['offset_heads'] else 'no'} | {r['first_loss']:.3f} | "
              f"{r['final_loss']:.3f} | {r['seconds']:.0f} |" for r in rows]
    (out / "models_warm_start.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
