"""The run directory never loses or mixes a user's work (seer.rundir)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seer.rundir import MARKER, RunDir, RunDirError, atomic_write_text, new_run_dir, resolve_run_dir


def _old_run(d, iterations=(3, 4)):
    """A run as a Seer before the marker wrote it: checkpoints, metrics, config, log, no seer-run.json."""
    run = RunDir(d)
    for it in iterations:
        run.commit_checkpoint(it, it + 1, keep=5)
    (d / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i}) + "\n" for i in range(5)))
    (d / "config.yaml").write_text("iterations: 5\n")
    run.log("run started")
    return run


def _seer_run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """A real `seer-run`; every refusal here comes before anything heavy starts."""
    return subprocess.run([sys.executable, "-m", "seer.cli", "--sync", *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd)


def _tree(d) -> dict[str, str]:
    return {str(p.relative_to(d)): (p.read_text() if p.is_file() else "/") for p in sorted(d.rglob("*"))}


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
    assert [p.name for p in d.iterdir()] == [MARKER]
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


def test_overwrite_of_a_directory_holding_a_config_and_user_files_deletes_nothing(tmp_path):
    """The repro of issue 27: `config.yaml` beside a thesis made the directory a "run", and
    `--overwrite` emptied it. Now a run is only what Seer marked, and nothing is removed."""
    d = tmp_path / "d"
    (d / "notes").mkdir(parents=True)
    (d / "config.yaml").write_text("my: config\n")
    (d / "thesis.tex").write_text("years of work")
    (d / "notes" / "n.txt").write_text("note")
    before = _tree(d)
    r = _seer_run("--iterations", "1", "--run-dir", str(d), "--overwrite")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not an empty directory or a Seer run" in r.stdout
    assert _tree(d) == before


def test_overwrite_refuses_a_seer_run_that_also_holds_user_files_naming_them(tmp_path):
    d = tmp_path / "run"
    _old_run(d)
    (d / "rollouts").mkdir()
    (d / "analysis.ipynb").write_text("mine")
    (d / "notes").mkdir()
    before = _tree(d)
    r = _seer_run("--iterations", "1", "--run-dir", str(d), "--overwrite")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "analysis.ipynb, notes" in " ".join(r.stdout.split())
    assert _tree(d) == before
    (d / "analysis.ipynb").unlink()
    (d / "notes").rmdir()
    (d / ".config.yaml.seer-tmp-ab12cd_9").write_text("cut by a kill")  # Seer's own temp file
    resolve_run_dir(str(d), resume=False, overwrite=True)
    assert [p.name for p in d.iterdir()] == [MARKER]


def test_overwrite_keeps_a_user_file_that_looks_like_a_temp_file(tmp_path):
    """A user's `.config.yaml.keep.tmp` is not Seer's temp file: --overwrite refuses, naming it, and
    deletes nothing; the temp file atomic_write_text really leaves is still recognised as Seer's."""
    d = tmp_path / "run"
    _old_run(d)
    (d / ".config.yaml.keep.tmp").write_text("my edits")
    (d / ".metrics.jsonl.1.tmp").write_text("mine too")
    before = _tree(d)
    with pytest.raises(RunDirError, match=r"\.config\.yaml\.keep\.tmp"):
        resolve_run_dir(str(d), resume=False, overwrite=True)
    assert _tree(d) == before
    (d / ".config.yaml.keep.tmp").unlink()
    (d / ".metrics.jsonl.1.tmp").unlink()
    import tempfile as _tempfile
    from seer import rundir
    fd, tmp = _tempfile.mkstemp(prefix=f".config.yaml{rundir._TEMP_TAG}", dir=d)  # what a kill leaves
    os.close(fd)
    assert rundir.foreign_entries(d) == []
    resolve_run_dir(str(d), resume=False, overwrite=True)
    assert [p.name for p in d.iterdir()] == [MARKER]


def test_overwrite_removes_only_what_it_checked(tmp_path, monkeypatch):
    """An entry that appears after the foreign-entry check was never checked: --overwrite leaves it."""
    from seer import rundir
    d = tmp_path / "run"
    _old_run(d)
    real = rundir.foreign_entries

    def check_then_a_user_writes(*args, **kwargs):
        out = real(*args, **kwargs)
        (d / "written-meanwhile.txt").write_text("mine")
        return out
    monkeypatch.setattr(rundir, "foreign_entries", check_then_a_user_writes)
    resolve_run_dir(str(d), resume=False, overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == sorted([MARKER, "written-meanwhile.txt"])
    assert (d / "written-meanwhile.txt").read_text() == "mine"


def test_a_repository_root_is_never_a_run_directory(tmp_path):
    """`--run-dir .` in a repository holding a config.yaml used to delete its .git too."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "config.yaml").write_text("my: config\n")
    (repo / MARKER).write_text("{}")  # even a marker does not make a repository a run
    before = _tree(repo)
    for flag in ("--overwrite", "--resume"):
        r = _seer_run("--iterations", "1", "--run-dir", ".", flag, cwd=repo)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "a repository's root" in r.stdout
    assert _tree(repo) == before
    with pytest.raises(RunDirError, match="root"):
        resolve_run_dir("/", resume=False, overwrite=True)
    with pytest.raises(RunDirError, match="home directory"):
        resolve_run_dir(str(Path.home()), resume=False, overwrite=True)


def test_overwrite_through_a_symlink_never_touches_files_seer_did_not_write(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.yaml").write_text("my: config\n")
    (target / "thesis.tex").write_text("years of work")
    link = tmp_path / "link"
    link.symlink_to(target)
    before = _tree(target)
    r = _seer_run("--iterations", "1", "--run-dir", str(link), "--overwrite")
    assert r.returncode == 2, r.stdout + r.stderr
    assert _tree(target) == before
    # A real run behind the link, whose weights/ is a link to the user's disk: the run's entries
    # go (the weights link, not what it points at), the link and the user's disk stay.
    (target / "thesis.tex").unlink()
    (target / "config.yaml").unlink()
    _old_run(target)
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "keep.bin").write_text("user data")
    (target / "weights").symlink_to(disk)
    resolve_run_dir(str(link), resume=False, overwrite=True)
    assert link.is_symlink() and [p.name for p in target.iterdir()] == [MARKER]
    assert (disk / "keep.bin").read_text() == "user data"


def test_resume_continues_a_run_written_before_the_marker_existed(tmp_path, tiny_model):
    """A run of an earlier Seer (no seer-run.json) is known by its committed checkpoints: the real
    `seer-run --resume` continues it (here: all its iterations are done) and marks it."""
    d = tmp_path / "old"
    _old_run(d)
    assert not (d / MARKER).exists()
    r = _seer_run("--resume", "--run-dir", str(d), "--iterations", "5", "--train", "off",
                  "--set", "model.preset=tiny")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing to do: 5 of 5 iterations already done" in r.stdout
    assert json.loads((d / MARKER).read_text())["seer_run"] == "old"
    assert [c.iteration for c in RunDir(d).complete_checkpoints()] == [3, 4]
    with pytest.raises(RunDirError, match="already holds a run"):
        resolve_run_dir(str(d), resume=False, overwrite=False)


def test_a_run_stopped_before_writing_anything_can_be_started_again(tmp_path):
    d = tmp_path / "run"
    assert resolve_run_dir(str(d), resume=False, overwrite=False) == d
    assert [p.name for p in d.iterdir()] == [MARKER]  # e.g. its dataset did not load
    assert resolve_run_dir(str(d), resume=False, overwrite=False) == d
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / MARKER).write_text("a user's file of that name")  # not Seer's mark: not a run, never replaced
    for overwrite in (False, True):
        with pytest.raises(RunDirError, match="not an empty directory or a Seer run"):
            resolve_run_dir(str(mine), resume=False, overwrite=overwrite)
    assert (mine / MARKER).read_text() == "a user's file of that name"


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
