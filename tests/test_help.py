"""Help that teaches: `seer-bench` reaches every benchmark, and every flag of `seer-run` and of
each benchmark says what it does."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from seer.bench_cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is not installed: the checkout's


class _Parsed(Exception):
    pass


def parser_of(main, monkeypatch) -> argparse.ArgumentParser:
    """The parser a command's main() builds, caught at its parse_args (nothing runs)."""
    def catch(self, args=None, namespace=None):
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(_Parsed) as got:
        main([])
    return got.value.args[0]


def _undocumented(p: argparse.ArgumentParser) -> list[str]:
    return ["/".join(a.option_strings) or a.dest for a in p._actions
            if not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip())]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_of_every_benchmark_has_a_help_text(name, monkeypatch):
    p = parser_of(importlib.import_module(COMMANDS[name][0]).main, monkeypatch)
    assert _undocumented(p) == []
    assert "--help" in p.format_help()  # help strings format (no stray %)


def test_bench_is_the_seer_bench_experiments_and_their_harness():
    """Every module of bench/ outside bench/harness/ is a seer-bench command (an experiment), and no
    command lives in the harness."""
    modules = {m for m, _ in COMMANDS.values()}
    experiments = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "bench").rglob("*.py")
                   if "harness" not in p.parts and "results" not in p.parts
                   and p.name not in ("__init__.py", "__main__.py")}
    assert experiments - modules == set(), "bench/ modules that are no seer-bench command (bench/harness/ is for helpers)"
    assert not {m for m in modules if m.startswith("bench.harness")}


def test_seer_run_flags_have_help_texts(monkeypatch):
    from seer import cli

    p = parser_of(cli.parse_args, monkeypatch)
    assert _undocumented(p) == []


def test_seer_bench_lists_its_commands_and_runs_one_with_help():
    r = subprocess.run([sys.executable, "-m", "seer.bench_cli"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and all(f"    {name} " in r.stdout for name in COMMANDS), r.stdout
    r = subprocess.run([sys.executable, "-m", "seer.bench_cli", "dgds-hotpath", "--help"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "--group-size" in r.stdout and "requests per group" in r.stdout, r.stderr


def test_seer_bench_finds_the_checkout_of_the_package_or_of_the_working_directory(tmp_path):
    from seer.bench_cli import checkout

    repo = tmp_path / "repo"
    (repo / "bench" / "harness").mkdir(parents=True)
    (repo / "bench" / "results").mkdir()
    (repo / "sub" / "dir").mkdir(parents=True)
    site = tmp_path / "site-packages"  # an installed package: no bench/ next to it
    site.mkdir()
    assert checkout(repo, tmp_path) == repo  # a source or editable install
    assert checkout(site, repo / "sub" / "dir") == repo  # installed, run from inside a checkout
    assert checkout(site, tmp_path) is None


def test_seer_bench_outside_a_checkout_says_the_experiment_needs_one(monkeypatch, capsys):
    from seer import bench_cli

    monkeypatch.setattr(bench_cli, "checkout", lambda package_parent, cwd: None)
    assert bench_cli.main(["sim", "--help"]) == 2
    err = capsys.readouterr().err
    assert "bench.sim.run" in err and "not installed with the package" in err and "checkout" in err
