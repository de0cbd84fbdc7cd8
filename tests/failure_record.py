"""Recovery times the failure tests measure, written where README.md's "Failure behaviour" cites them.

Each failure test asserts its recovery bound and calls `record(name, test, bounds, measured)`.
Nothing is written unless SEER_RECORD=1: then `bench/results/failures/<name>.json` gets the
measured values next to the bounds the test asserted, the test's node id, the date, the commit
and the machine's load average (recorded once, from a run of the failure tests under the vLLM
lock by `python -m bench.failures`; README.md quotes those files).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAILURES = ROOT / "bench" / "results" / "failures"


def recording() -> bool:
    return os.environ.get("SEER_RECORD") == "1"


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def record(name: str, test: str, bounds: dict[str, float], measured: dict, notes: str = "") -> Path | None:
    """Write `bench/results/failures/<name>.json` when SEER_RECORD=1; returns its path (or None)."""
    print(f"\n{name}: measured {measured}; bounds {bounds}")
    if not recording():
        return None
    FAILURES.mkdir(parents=True, exist_ok=True)
    path = FAILURES / f"{name}.json"
    doc = {
        "test": test,
        "command": f"python -m bench.failures {test}",  # under the vLLM lock; SEER_RECORD=1 pytest -s, in effect
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": _commit(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "cpus": len(os.sched_getaffinity(0)),
        "bounds_s": bounds,
        "measured": measured,
        "notes": notes,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
