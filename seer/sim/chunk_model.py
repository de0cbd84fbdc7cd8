"""What a chunk costs beyond the engine steps that generate its tokens: a measured model.

Divided rollout sends a request to an instance once per chunk. Each chunk is a new HTTP request
through the instance's API server, a new request in the engine that finds its prefix in the
prefix cache (or recomputes it, if it moved without a KV pool), and a result that travels back to
the driver. The step model (`step_model.py`) has none of that; this adds it as two numbers,
measured on real instances by `python -m bench.sim.measure_chunks` into `chunk_costs.json`:

* `latency_s`: time a chunk spends outside the engine that does not hold the instance up (the
  HTTP round trip, the driver's event loop, the scheduler's turn-around); the chunk holds its KV
  booking meanwhile but does not decode;
* `instance_s`: time each chunk's admission takes from the instance itself (API-server parsing and
  response building on the instance's core, the engine's admission and prefix-cache lookup, the
  recomputed last token), during which nobody on the instance decodes; B chunks admitted together
  queue behind each other.

The fit: the same trace-driven workload (every request the same length) cut into 1, 2, 4 and 8
chunks per request at several batch sizes B per instance. Requests are alike, so each instance's
B requests re-admit together and the wall time grows by `latency_s + B x instance_s` per extra
chunk: the slope of wall time against chunks per request at each B (least squares), then that
slope against B (least squares, non-negative).

On the step model's scale: the machine is shared, and what it runs besides slows everything on
it alike (engine steps, API server, driver: all CPU work). The single-chunk runs measure that
slowdown, `slowdown = measured wall / the step model's wall` for the same workload (simulated
with no chunk cost), and the slopes are divided by it, so the chunk costs are in the same
seconds as the step model they are simulated with (seer/sim/step_times.json, measured on a
quieter machine). The raw slopes and the slowdown are kept in chunk_costs.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK_COSTS = Path(__file__).with_name("chunk_costs.json")


@dataclass(frozen=True)
class ChunkCost:
    latency_s: float = 0.0  # out of the engine; the instance keeps decoding the others
    instance_s: float = 0.0  # the instance's own time per chunk admitted (nobody decodes meanwhile)

    def describe(self) -> str:
        return f"{self.latency_s * 1e3:.0f} ms latency + {self.instance_s * 1e3:.1f} ms of instance time per chunk"


# Paper-scale default: GPU clusters. A chunk there is a request to a vLLM server whose API process
# has CPU cores of its own (not the engine's): an HTTP round trip and an admission of a few
# milliseconds, which the engine overlaps with decoding; 50 ms of latency is a generous bound.
# Against an 8192-token chunk (8192 steps of >= 10 ms: >= 80 s in the engine) it is < 0.1%;
# docs/bench.md shows the simulated ladder does not move with it.
GPU_CLUSTER = ChunkCost(latency_s=0.05, instance_s=0.0)


def fit(runs: list[dict]) -> dict:
    """The two-parameter fit above from measured runs ({batch, chunks_per_request, wall_s, and
    step_model_wall_s: the simulated wall of the run's workload as one chunk, no chunk cost})."""
    by_b: dict[int, list[dict]] = {}
    for r in runs:
        by_b.setdefault(r["batch"], []).append(r)
    slopes = []
    for b, rs in sorted(by_b.items()):
        x = np.array([r["chunks_per_request"] for r in rs], dtype=float)
        y = np.array([r["wall_s"] for r in rs], dtype=float)
        k, c = np.polyfit(x, y, 1)
        pred = k * x + c
        single = [r["wall_s"] for r in rs if r["chunks_per_request"] == 1.0]
        slowdown = float(np.mean(single)) / rs[0]["step_model_wall_s"] if single else 1.0
        slopes.append({"batch": b, "slope_s_per_chunk": float(k), "intercept_s": float(c),
                       "mean_abs_rel_error": float(np.mean(np.abs(pred - y) / y)),
                       "slowdown": slowdown, "normalized_slope_s_per_chunk": float(k) / slowdown})
    bs = np.array([s["batch"] for s in slopes], dtype=float)
    ks = np.array([s["normalized_slope_s_per_chunk"] for s in slopes], dtype=float)
    a = np.stack([np.ones_like(bs), bs], axis=1)
    coef = np.linalg.lstsq(a, ks, rcond=None)[0]
    if coef[0] < 0:  # a negative latency is unphysical: all of it per chunk admitted
        coef = np.array([0.0, max(float(bs @ ks / (bs @ bs)), 0.0)])
    elif coef[1] < 0:
        coef = np.array([max(float(ks.mean()), 0.0), 0.0])
    pred = a @ coef
    return {"latency_s": float(coef[0]), "instance_s": float(coef[1]), "per_batch": slopes,
            "slope_fit_abs_error_s": [float(e) for e in np.abs(pred - ks)]}


def load_chunk_costs(path: str | Path = CHUNK_COSTS) -> ChunkCost:
    d = json.loads(Path(path).read_text())
    return ChunkCost(d["fit"]["latency_s"], d["fit"]["instance_s"])
