"""Which instruction-set pins change the bits of the embedded model's build, on this machine.

`python -m bench.model_isa --steps 5 --out bench/results/models/isa_pins`: builds the default
preset with its warm start cut to `--steps` steps, in-process (seer.model.build.build_model) in a
fresh Python per environment: none of the pins, each pin alone, all pins (seer.model.build.ISA_PINS),
and all pins with glibc's AVX-512 variants switched off; then one seeded sgemm under each MKL
setting. Records the sha256 of each model.safetensors and torch's CPU capability in that process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from seer.model.build import ISA_PINS

BUILD = r"""
import dataclasses, hashlib, json, sys, torch
from seer.model.build import build_model
from seer.model.presets import get_preset
p = get_preset("default")
p = dataclasses.replace(p, warm_start=dataclasses.replace(p.warm_start, steps=int(sys.argv[2])))
build_model(p, sys.argv[1], progress=False)
info = json.load(open(sys.argv[1] + "/seer_build.json"))
print(json.dumps({"sha256": hashlib.sha256(open(sys.argv[1] + "/model.safetensors", "rb").read()).hexdigest(),
                  "capability": torch.backends.cpu.get_cpu_capability(), "final_loss": info["warm_start"]["final_loss"]}))
"""
SGEMM = r"""
import hashlib, json, torch
torch.manual_seed(0); torch.set_num_threads(2)
a, b = torch.randn(1024, 1000), torch.randn(1000, 768)
print(json.dumps({"sha256": hashlib.sha256((a @ b).numpy().tobytes()).hexdigest()}))
"""
GLIBC_NO_AVX512 = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD"


def run(code: str, args: list[str], env: dict) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ISA_PINS}
    r = subprocess.run([sys.executable, "-c", code, *args], env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="warm-start steps of each build (the default's cut short)")
    ap.add_argument("--out", type=Path, required=True, help="where model_isa.json and .md go")
    a = ap.parse_args(argv)
    builds = {"none": {}, **{k: {k: v} for k, v in ISA_PINS.items()}, "all pins": dict(ISA_PINS),
              "all pins, glibc without AVX-512": {**ISA_PINS, "GLIBC_TUNABLES": GLIBC_NO_AVX512}}
    rows = []
    for name, env in builds.items():
        with tempfile.TemporaryDirectory() as d:
            rows.append({"build": name, "env": env, **run(BUILD, [d, str(a.steps)], env)})
            print(rows[-1], flush=True)
    mkl = {}
    for setting in ("unset", "MKL_CBWR=AVX2,STRICT", "MKL_CBWR=AVX512", "MKL_CBWR=COMPATIBLE",
                    "MKL_ENABLE_INSTRUCTIONS=SSE4_2", "MKL_ENABLE_INSTRUCTIONS=AVX2"):
        env = dict([setting.split("=", 1)]) if "=" in setting else {}
        mkl[setting] = run(SGEMM, [], env)["sha256"]
        print(setting, mkl[setting], flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    import torch

    out = {"command": " ".join(["python -m bench.model_isa", *(sys.argv[1:] if argv is None else argv)]), "cpu": cpu, "machine": platform.machine(),
           "avx512f": "avx512f" in flags, "torch": torch.__version__, "steps": a.steps, "builds": rows, "mkl_sgemm": mkl}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "model_isa.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"Default preset, warm start cut to {a.steps} steps, built in a fresh process per environment on "
             f"{cpu} (AVX-512: {out['avx512f']}), torch {out['torch']}.", "",
             "| environment | torch capability | model.safetensors sha256 |", "|---|---|---|"]
    lines += [f"| {r['build']} | {r['capability']} | `{r['sha256'][:16]}` |" for r in rows]
    lines += ["", "One seeded 1024x1000 @ 1000x768 fp32 matmul (MKL sgemm) per MKL setting:", "",
              "| MKL setting | result sha256 |", "|---|---|"] + [f"| {k} | `{v[:16]}` |" for k, v in mkl.items()]
    (a.out / "model_isa.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
