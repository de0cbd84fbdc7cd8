"""A run's directory: what it holds, who may write into it, and files that survive a kill.

A run directory belongs to one run. A new run never writes into a directory that holds another
run unless the user says `--overwrite` (replace it) or `--resume` (continue it), so a later
`--resume` can never continue the wrong run. A run is what Seer marked as one (`seer-run.json`,
written first; a directory of an earlier Seer is known by its committed loop state), never a guess
from common file names, and `--overwrite` removes only what Seer writes: a directory that holds
anything else is refused, naming it. Every state file is written whole or not at all (temp file,
fsync, rename), and checkpoints are ordered by their integer iteration, not by name.
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

# Written first into every run directory: it says the directory is a Seer run, and which.
MARKER = "seer-run.json"
# Every entry Seer writes into a run directory (and so the only ones `--overwrite` removes), with
# who writes it. A new one belongs here, or `--overwrite` refuses every run that holds it.
SEER_ENTRIES = (
    MARKER,  # resolve_run_dir
    "config.yaml",  # seer.job: the resolved config
    "run.log",  # RunDir.log
    "metrics.jsonl",  # seer.metrics_log
    "checkpoints",  # RunDir.commit_checkpoint (and the trainer's part of each)
    "rollouts",  # seer.job.write_rollouts, seer.watch (traces)
    "weights",  # seer.job.export_weights
    "logs",  # seer.fleet (Ray head, vLLM instances)
    "kvpool",  # seer.kvpool (Mooncake configs and logs)
    "dgds",  # seer.fleet (the draft server's log)
    "tensorboard", "mlruns", "wandb", "tracking.json",  # seer.watch.tracking
    "iterations.png",  # seer.loop
)
# A temp file of atomic_write_text that a kill left behind (".config.yaml.seer-tmp-x1y2z3w4"): Seer's
# marker and tempfile's 8 random characters, so that a user's ".config.yaml.keep.tmp" is never one.
_TEMP_TAG = ".seer-tmp-"
_TEMP = re.compile(r"^\.(?P<name>.+)" + re.escape(_TEMP_TAG) + r"[a-z0-9_]{8}$")
_ITER = re.compile(r"^iter_(\d+)$")


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says why and what to pass."""


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` so that a reader (or a kill at any instant) sees the old content or
    the new, never a part: a temp file in the same directory, fsync, rename, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{_TEMP_TAG}", dir=path.parent)
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
    """Seer marked `d` as a run, or an earlier Seer (before the marker) committed a checkpoint in it."""
    if not d.is_dir():
        return False
    return _marked(d) or bool(RunDir(d).complete_checkpoints())


def _marked(d: Path) -> bool:
    """`d` holds the marker Seer wrote (a JSON object naming the run), not a file that shares its name."""
    try:
        return "seer_run" in json.loads((d / MARKER).read_text())
    except (OSError, ValueError, TypeError):
        return False


def foreign_entries(d: Path, names: list[str] | None = None) -> list[str]:
    """What in `d` (or of `names`, a listing of it) Seer did not write (`--overwrite` removes nothing, then)."""
    def seer(name: str) -> bool:
        m = _TEMP.match(name)
        return name in SEER_ENTRIES or (m is not None and m["name"] in SEER_ENTRIES)
    return sorted(n for n in (os.listdir(d) if names is None else names) if not seer(n))


def _never_a_run_dir(d: Path) -> str | None:
    """Why `d` can never be a run directory (the root, a home, a repository), or None."""
    real = d.resolve()
    if real == Path(real.anchor):
        return "the file system's root"
    try:
        home = Path.home().resolve()
    except RuntimeError:  # no HOME and no password entry
        home = None
    if real == home:
        return "the home directory"
    if (real / ".git").exists():
        return "a repository's root"
    return None


def _mark(d: Path) -> None:
    atomic_write_text(d / MARKER, json.dumps({"seer_run": d.resolve().name, "path": str(d.resolve()),
                                              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


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
    _mark(d)
    return d


def resolve_run_dir(run_dir: str | None, *, resume: bool, overwrite: bool, root: str = "runs") -> Path:
    """The directory this run writes to, or a RunDirError before anything starts.

    - no `run_dir`: a new `runs/<date>-<time>`; with `resume`, the run `runs/latest` points at;
    - `/`, the home directory or a repository's root: refused, whatever the flags;
    - an explicit directory that holds a run (`holds_run`): refused unless `resume` or
      `overwrite`; overwrite removes Seer's entries (SEER_ENTRIES) and is refused, naming them,
      when the directory holds anything else;
    - an explicit directory that is not empty and holds no run: refused either way, so that
      `--overwrite` never deletes anything that is not a run.
    Through a symbolic link, all of this holds for the directory it points at.
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
    if why := _never_a_run_dir(d):
        raise RunDirError(f"{d} is {why}: it can never be a run directory; choose another --run-dir")
    if resume:
        if not holds_run(d):
            raise RunDirError(f"--resume: {d} holds no run (no {MARKER} and no committed checkpoint)")
        if not (d / MARKER).exists():
            _mark(d)  # a run of an earlier Seer: marked now, so that it stays one (never over a user's file)
        return d
    if d.is_dir() and [c.name for c in d.iterdir()] == [MARKER] and _marked(d):
        return d  # marked, and then stopped before it wrote anything (a dataset that did not load)
    if holds_run(d):
        if not overwrite:
            raise RunDirError(f"{d} already holds a run; pass --resume to continue it, --overwrite to replace it, "
                              f"or choose another --run-dir")
        # One listing, checked and then removed: an entry that appears after the check (a user's file
        # written meanwhile) was never checked, so it is never removed.
        checked = sorted(os.listdir(d))
        if foreign := foreign_entries(d, checked):
            raise RunDirError(f"--overwrite: {d} holds a run but also {', '.join(foreign)}, which Seer did not "
                              f"write; --overwrite removes nothing then: move them, or choose another --run-dir")
        for name in checked:
            child = d / name
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink(missing_ok=True)  # a link: the link, never what it points at
        _mark(d)
        return d
    if d.exists() and (not d.is_dir() or any(d.iterdir())):
        raise RunDirError(f"{d} exists and is not an empty directory or a Seer run (no {MARKER}); "
                          f"choose another --run-dir")
    d.mkdir(parents=True, exist_ok=True)
    _mark(d)
    return d


@dataclass(frozen=True)
class Checkpoint:
    iteration: int
    path: Path
    weight_version: int
    prompt_cursor: int | None = None  # the next draw position of the prompt stream; None: a checkpoint from before it was kept


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
                cursor = state.get("prompt_cursor")
                out.append(Checkpoint(int(state["iteration"]), d, int(state["weight_version"]),
                                      None if cursor is None else int(cursor)))
            except (ValueError, KeyError, TypeError):
                continue  # not a committed checkpoint
        return sorted(out, key=lambda c: c.iteration)

    def latest_checkpoint(self) -> Checkpoint | None:
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def commit_checkpoint(self, iteration: int, version: int, keep: int, write_state=None,
                          prompt_cursor: int | None = None) -> Path:
        """Write a checkpoint (`write_state(dir)` writes the trainer's part first), commit it with
        its loop_state.json (the prompt cursor too, where the loop keeps one), then prune all but the
        newest `keep` by iteration."""
        d = self.checkpoint_dir(iteration)
        d.mkdir(parents=True, exist_ok=True)
        if write_state is not None:
            write_state(d)
        state = {"iteration": iteration, "weight_version": version, "time": time.time()}
        if prompt_cursor is not None:
            state["prompt_cursor"] = prompt_cursor
        atomic_write_text(d / "loop_state.json", json.dumps(state))
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
