"""vLLM 0.32's CPU rejection sampler: the bug ``seer.compat.vllm_cpu_fixes`` corrects, and the sampled
distribution with the correction. No engine: one fresh process (``vllm_sampler_probe.py``) sets the
sampler up as an engine worker does (its time is mostly importing vLLM). The end-to-end check on
a real instance is in tests/dgds/test_vllm_proposer.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

EXPANDED = pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.0])


@pytest.fixture(scope="module")
def probe() -> dict:
    env = dict(os.environ)
    env.pop("SEER_VLLM_CPU_FIX", None)
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_sampler_probe.py"))],
                         capture_output=True, text=True, timeout=600, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT "):])
    if not res["applicable"]:
        pytest.skip("only vLLM's CPU backend without Triton-CPU replaces the sampler kernels")
    return res


def test_vllm_cpu_expand_override_drops_float_output(probe):
    """The cause, as installed: vLLM's CPU ``expand_kernel`` writes into an int64 copy of the float
    output and drops it. If this starts failing, vLLM fixed it and the correction can go."""
    assert probe["before"]["expanded"] != EXPANDED


def test_fix_expands_per_request_values_in_their_dtype(probe):
    assert probe["applied"] == [True, False]  # replaced once; the second call sees it done
    assert probe["after"]["expanded"] == EXPANDED
    assert probe["after"]["top_k"] == ["torch.int32", [5, 5, 5, 0]]


def test_drafted_positions_sample_the_target_distribution(probe):
    """Lossless speculative sampling: whatever the draft, the token decided at a drafted position
    follows softmax(logits / T) (20,000 rows, 16 tokens: sampling noise ~0.01 in total variation).
    vLLM's CPU sampler as installed is 0.3-1.0 away: it divides by uninitialised memory (which may
    by chance hold an earlier temperature, hence one of the two is enough)."""
    assert max(probe["before"]["tv"].values()) > 0.1, probe["before"]["tv"]
    assert all(tv < 0.03 for tv in probe["after"]["tv"].values()), probe["after"]["tv"]
