"""The run directory never loses or mixes a user's work (seer.rundir)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from seer.rundir import RunDir, RunDirError, atomic_write_text, new_run_dir, resolve_run_dir


def _old_run(d, iterations=(3, 4)):
    run = RunDir(d)
    for it in iterations:
        run.commit_checkpoint(it, it + 1, keep=5)
    (d / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i}) + "\n" for i in range(5)))
    return run


def test_a_fresh_run_in_a_directory_holding_a_run_is_refused(tmp_path):
    """The old defect: a new run in an old run's directory pruned its own checkpoints by name and
    a later --resume continued the old run. Now the new run is refused before anything starts."""
    d = tmp_path / "run"
    _old_run(d)
    with pytest.raises(RunDirError, match="already holds a run.*--resume.*--overwrite"):
        resolve_run_dir(str(d), resume=False, overwrite=False)
    assert [c.iteration for c in RunDir(d).complete_checkpoints()] == [3, 4]  # nothing touched


def test_overwrite_replaces_the_old_run_and_the_new_checkpoints_survive(tmp_path):
    d = tmp_path / "run"
    _old_run(d)
    (d / "rollouts").mkdir()
    (d / "rollouts" / "iter_0004.jsonl").write_text("old\n")
    resolve_run_dir(str(d), resume=False, overwrite=True)
    assert list(d.iterdir()) == []
    run = RunDir(d)
    for it in range(3):
        run.commit_checkpoint(it, it + 1, keep=2)
    assert [c.iteration for c in run.complete_checkpoints()] == [1, 2]
    assert run.latest_checkpoint().iteration == 2


def test_resume_continues_the_run_in_the_directory(tmp_path):
    d = tmp_path / "run"
    _old_run(d)
    assert resolve_run_dir(str(d), resume=True, overwrite=False) == d
    assert RunDir(d).latest_checkpoint().iteration == 4
    with pytest.raises(RunDirError, match="holds no run"):
        resolve_run_dir(str(tmp_path / "empty"), resume=True, overwrite=False)
    with pytest.raises(RunDirError, match="exclude each other"):
        resolve_run_dir(str(d), resume=True, overwrite=True)


def test_overwrite_never_deletes_a_directory_that_is_not_a_run(tmp_path):
    d = tmp_path / "home"
    d.mkdir()
    (d / "thesis.tex").write_text("years of work")
    for overwrite in (False, True):
        with pytest.raises(RunDirError, match="not an empty directory or a Seer run"):
            resolve_run_dir(str(d), resume=False, overwrite=overwrite)
    assert (d / "thesis.tex").read_text() == "years of work"


def test_runs_without_a_directory_get_new_ones_and_latest_points_at_the_newest(tmp_path):
    root = tmp_path / "runs"
    a = resolve_run_dir(None, resume=False, overwrite=False, root=str(root))
    _old_run(a)
    b = resolve_run_dir(None, resume=False, overwrite=False, root=str(root))
    assert a != b and a.parent == b.parent == root
    assert (root / "latest").resolve() == b.resolve()
    assert [c.iteration for c in RunDir(a).complete_checkpoints()] == [3, 4]  # the first run is untouched
    _old_run(b, iterations=(0,))
    assert resolve_run_dir(None, resume=True, overwrite=False, root=str(root)) == b.resolve()
    with pytest.raises(RunDirError, match="does not exist"):
        resolve_run_dir(None, resume=True, overwrite=False, root=str(tmp_path / "nothing"))
    assert new_run_dir(root) != b


def test_checkpoints_are_ordered_by_integer_iteration(tmp_path):
    run = RunDir(tmp_path)
    for it in (9_998, 9_999, 10_000, 10_001):
        run.commit_checkpoint(it, it, keep=3)
    assert [c.iteration for c in run.complete_checkpoints()] == [9_999, 10_000, 10_001]
    assert run.latest_checkpoint().iteration == 10_001


def test_a_checkpoint_without_its_committed_state_is_not_a_checkpoint(tmp_path):
    run = RunDir(tmp_path)
    run.commit_checkpoint(0, 1, keep=5)
    run.checkpoint_dir(1).mkdir(parents=True)  # killed while the trainer wrote its part
    (run.checkpoint_dir(2)).mkdir()
    (run.checkpoint_dir(2) / "loop_state.json").write_text('{"iteration": 2, "weight')  # not atomic: cut
    assert run.latest_checkpoint().iteration == 0


_WRITER = """
import itertools, sys
from seer.rundir import RunDir
run = RunDir(sys.argv[1])
print("ready", flush=True)
for it in itertools.count(1):
    run.commit_checkpoint(0, it, keep=1)  # rewrites loop_state.json of iteration 0, forever
    print(it, flush=True)  # committed
"""


def test_a_kill_while_writing_the_loop_state_leaves_the_previous_state_readable(tmp_path):
    """Killed at any point of a rewrite, the state is the last one committed or the one being written."""
    run = RunDir(tmp_path / "run")
    run.commit_checkpoint(0, 0, keep=1)
    for delay in (0.05, 0.11, 0.23, 0.31, 0.47):
        out = tmp_path / f"writer-{delay}.out"  # a file, not a pipe: the writer never blocks on printing
        with open(out, "w") as f:
            p = subprocess.Popen([sys.executable, "-c", _WRITER, str(run.path)], stdout=f)
        deadline = time.monotonic() + 60
        while not out.read_text().startswith("ready\n"):
            assert p.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.01)
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        committed = [int(x) for x in out.read_text().split()[1:] if x.isdigit()]
        last = committed[-1] if committed else 0
        ckpt = run.latest_checkpoint()
        assert ckpt is not None and ckpt.iteration == 0
        # the one it printed last, or the next one if the kill fell between the rename and the print
        assert ckpt.weight_version in (last, last + 1), (ckpt.weight_version, committed[-3:])
        state = json.loads((run.checkpoint_dir(0) / "loop_state.json").read_text())
        assert state["weight_version"] == ckpt.weight_version


def test_atomic_write_replaces_whole_files(tmp_path):
    p = atomic_write_text(tmp_path / "a" / "state.json", "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [x.name for x in p.parent.iterdir()] == ["state.json"]  # no temp file left behind
