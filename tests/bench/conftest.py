"""The benchmarks live in `bench/` at the repository root (not part of the installed package)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import os

import pytest


@pytest.fixture(scope="session")
def bench_model(request):
    """The checkpoint the real-instance bench test serves: $SEER_BENCH_MODEL if set (any tiny
    Qwen2 directory; the test needs vLLM to serve it, not a trained policy), else the embedded tiny preset."""
    path = os.environ.get("SEER_BENCH_MODEL")
    if path:
        return Path(path)
    return request.getfixturevalue("tiny_model")
