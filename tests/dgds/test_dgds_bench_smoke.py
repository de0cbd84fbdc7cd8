"""The hot-path benchmark runs end to end on a tiny configuration and writes its outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hotpath_bench_tiny(tmp_path: Path):
    subprocess.run([sys.executable, str(ROOT / "bench" / "dgds_hotpath.py"), "--groups", "2", "--group-size", "3",
                    "--tokens", "120", "--out", str(tmp_path)], check=True, capture_output=True, timeout=120)
    res = json.loads((tmp_path / "dgds_hotpath.json").read_text())
    assert res["tree_append"]["tokens_per_s"] > 0
    assert res["speculate_linear"]["requests"] == 256
    assert res["service"]["client_batch_speculate_256"]["p50_ms"] > 0
    assert "| append, tree" in (tmp_path / "dgds_hotpath.md").read_text()


def test_load_bench_tiny(tmp_path: Path):
    """Several client processes against a real `seer-dgds serve`: no errors, latencies and memory reported."""
    subprocess.run([sys.executable, "-m", "bench.dgds_load", "--clients", "4", "--seconds", "3", "--processes", "2",
                    "--ttl", "1", "--out", str(tmp_path)], check=True, capture_output=True, timeout=180, cwd=ROOT)
    res = json.loads((tmp_path / "dgds_load.json").read_text())
    assert res["errors"] == 0 and res["update_calls"] > 0 and res["fetch_calls"] == res["update_calls"]
    assert res["update_p50_ms"] > 0 and res["rss_mib_max"] > 0
    assert (tmp_path / "dgds_load.png").stat().st_size > 1000
