"""Which code a recorded result ran on: the commit, and whether seer/ or bench/ had uncommitted changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def code_version(root: Path = ROOT) -> tuple[str, bool]:
    """(short commit, uncommitted changes under seer/ or bench/ apart from bench/results/, which
    holds outputs: an earlier run of a series rewriting its files is no change to the code)."""
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "seer", "bench",
                                 ":(exclude)bench/results"], capture_output=True, text=True).stdout.strip())
    return commit, dirty
