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
