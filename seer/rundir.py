"""A run's directory: what it holds, who may write into it, and files that survive a kill.

A run directory belongs to one run. A new run never writes into a directory that holds another
run's checkpoints, metrics, rollouts or weights unless the user says `--overwrite` (replace it)
or `--resume` (continue it), so a later `--resume` can never continue the wrong run. Every state
file is written whole or not at all (temp file, fsync, rename), and checkpoints are ordered by
their integer iteration, not by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# What marks a directory as holding a run (any one of them).
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "rollouts", "weights", "run.log")
_ITER = re.compile(r"^iter_(\d+)$")


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says why and what to pass."""


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` so that a reader (or a kill at any instant) sees the old content or
    the new, never a part: a temp file in the same directory, fsync, rename, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def holds_run(d: Path) -> bool:
    return d.is_dir() and any((d / m).exists() for m in RUN_MARKERS)


def new_run_dir(root: str | os.PathLike = "runs") -> Path:
    """`runs/<date>-<time>` (a suffix if taken), with `runs/latest` pointing at it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    d, n = root / stamp, 1
    while True:
        try:
            d.mkdir()
            break
        except FileExistsError:
            n += 1
            d = root / f"{stamp}-{n}"
    link = root / "latest"
    tmp = root / f".latest.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(d.name)
    os.replace(tmp, link)
    return d


def resolve_run_dir(run_dir: str | None, *, resume: bool, overwrite: bool, root: str = "runs") -> Path:
    """The directory this run writes to, or a RunDirError before anything starts.

    - no `run_dir`: a new `runs/<date>-<time>`; with `resume`, the run `runs/latest` points at;
    - an explicit directory that holds a run: refused unless `resume` or `overwrite`
      (overwrite removes its contents first: the user asked);
    - an explicit directory that is not empty and holds no run: refused either way, so that
      `--overwrite` never deletes anything that is not a run.
    """
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the run or replace it")
    if run_dir is None:
        if not resume:
            return new_run_dir(root)
        latest = Path(root) / "latest"
        if not latest.exists():
            raise RunDirError(f"--resume without --run-dir continues {latest}, which does not exist; "
                              f"pass --run-dir DIR")
        return latest.resolve()
    d = Path(run_dir)
    if resume:
        if not holds_run(d):
            raise RunDirError(f"--resume: {d} holds no run (no {', '.join(RUN_MARKERS)})")
        return d
    if holds_run(d):
        if not overwrite:
            raise RunDirError(
                f"{d} already holds a run ({', '.join(m for m in RUN_MARKERS if (d / m).exists())}); "
                f"pass --resume to continue it, --overwrite to replace it, or choose another --run-dir")
        for child in d.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        return d
    if d.exists() and (not d.is_dir() or any(d.iterdir())):
        raise RunDirError(f"{d} exists and is not an empty directory or a Seer run; choose another --run-dir")
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass(frozen=True)
class Checkpoint:
    iteration: int
    path: Path
    weight_version: int


class RunDir:
    """Paths and state files of one run directory (already resolved by `resolve_run_dir`)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint_dir(self, iteration: int) -> Path:
        return self.checkpoints / f"iter_{iteration:04d}"

    def weights_dir(self, version: int) -> Path:
        return self.path / "weights" / f"v{version:05d}"

    def rollout_file(self, iteration: int) -> Path:
        return self.path / "rollouts" / f"iter_{iteration:04d}.jsonl"

    def complete_checkpoints(self) -> list[Checkpoint]:
        """Checkpoints whose loop_state.json (written last) is readable, by integer iteration."""
        out = []
        if not self.checkpoints.is_dir():
            return out
        for d in self.checkpoints.iterdir():
            m = _ITER.match(d.name)
            if not m or not (d / "loop_state.json").is_file():
                continue
            try:
                state = json.loads((d / "loop_state.json").read_text())
                out.append(Checkpoint(int(state["iteration"]), d, int(state["weight_version"])))
            except (ValueError, KeyError, TypeError):
                continue  # not a committed checkpoint
        return sorted(out, key=lambda c: c.iteration)

    def latest_checkpoint(self) -> Checkpoint | None:
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def commit_checkpoint(self, iteration: int, version: int, keep: int, write_state=None) -> Path:
        """Write a checkpoint (`write_state(dir)` writes the trainer's part first), commit it with
        its loop_state.json, then prune all but the newest `keep` by iteration."""
        d = self.checkpoint_dir(iteration)
        d.mkdir(parents=True, exist_ok=True)
        if write_state is not None:
            write_state(d)
        atomic_write_text(d / "loop_state.json",
                          json.dumps({"iteration": iteration, "weight_version": version, "time": time.time()}))
        for old in self.complete_checkpoints()[:-keep]:
            shutil.rmtree(old.path, ignore_errors=True)
        return d

    def log(self, line: str) -> None:
        """One timestamped line in run.log: what the terminal showed, for a run nobody watched."""
        with open(self.path / "run.log", "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")

    def prune_weights(self, keep_version: int) -> None:
        for old in (self.path / "weights").glob("v*"):
            if old != self.weights_dir(keep_version):
                shutil.rmtree(old, ignore_errors=True)
