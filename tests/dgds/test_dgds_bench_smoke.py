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
    """Simulated instances against a real `seer-dgds serve` (with a secret): no errors, every offered
    token appended and delivered to each replica of its group (one generation of groups, fetched to
    their ends once appends stop), server CPU, latencies and memory."""
    group_size = 2
    subprocess.run([sys.executable, "-m", "bench.dgds_load", "--instances", "4", "--group-size", str(group_size),
                    "--requests", "3", "--seconds", "2", "--warmup-s", "1", "--generation-s", "100", "--ttl", "30",
                    "--out", str(tmp_path)], check=True, capture_output=True, timeout=180, cwd=ROOT)
    res = json.loads((tmp_path / "dgds_load.json").read_text())
    assert res["errors"] == 0 and res["unknown_groups"] == 0 and res["messages_per_s"] > 0
    assert res["offered_all_tokens"] > 0 and res["appended_all_tokens"] == res["offered_all_tokens"]
    assert res["delivered_all_tokens"] == group_size * res["appended_all_tokens"]
    assert res["appended_tokens_per_s"] > 0 and res["delivered_tokens_per_s"] > 0
    assert res["server_us_per_appended_token"] > 0 and res["server_msg_p99_ms"] > 0 and res["client_msg_p99_ms"] > 0
    assert res["rss_mib_max"] > 0 and "python -m bench.dgds_load" in res["command"]
    assert (tmp_path / "dgds_load.png").stat().st_size > 1000
