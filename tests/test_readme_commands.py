"""The commands the README and its user-facing docs pages show, as written. Most are parsed, not run (each takes minutes, a
cluster or a GPU): a `seer-run` line with `--print-config`, which parses every flag and setting and
starts nothing; a `make` line with `make -n` (the target exists and expands); a benchmark's and
`ray`'s flags against their `--help`; the inline benchmark commands' flags against their parsers.
The DGDS recipe for another framework's `vllm serve` is run for real (a `vllm` test)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from seer.procs import free_port

ROOT = Path(__file__).resolve().parents[1]
# the README and the user-facing pages it hands its sections to (the benchmark pages' commands are
# checked by tests/test_results_index.py)
PAGES = ["README.md", *(f"docs/{n}.md" for n in ("watching", "cluster", "default-run", "multiturn", "scheduling",
                                                 "failures"))]
README = "\n".join((ROOT / p).read_text() for p in PAGES)
# inline benchmark commands: every page but the dated history
INLINE_TEXT = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
                         if p.name != "bench-log.md")
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.S)


def commands(block: str) -> list[list[str]]:
    """The block's command lines (continuations joined), split as the shell would, comments dropped."""
    text = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if shlex.split(line, comments=True)]


def _venv(word: str) -> str:
    return str(BIN / word.removeprefix(".venv/bin/")) if word.startswith(".venv/bin/") else word


def test_the_command_blocks_parse_as_written(tmp_path):
    (tmp_path / "my.yaml").write_text("iterations: 1\n")  # the README's example config file
    tried = 0
    for block in bash_blocks():
        if "SEER_DGDS_ADDRESS" in block:
            continue  # the DGDS recipe starts vLLM: test_the_dgds_recipe_for_vllm_serve_runs_as_written
        for argv in commands(block):
            cmd = [_venv(argv[0]), *argv[1:]]
            name = Path(argv[0]).name
            if name == "make":
                run = [*cmd[:1], "-n", *cmd[1:]]  # the target exists and expands
                r = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=60)
            elif name == "seer-run":
                r = subprocess.run([sys.executable, "-m", "seer.cli", *cmd[1:], "--print-config"], cwd=tmp_path,
                                   capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})  # this checkout's seer
                assert "iterations:" in r.stdout, " ".join(argv) + r.stdout + r.stderr
            elif name == "seer-bench":  # the benchmarks take minutes: the command exists, its flags too
                r = subprocess.run([sys.executable, "-m", "seer.bench_cli", *cmd[1:], "--help"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=120)
                unknown = [a.split("=")[0] for a in argv[2:] if a.startswith("--") and a.split("=")[0] not in r.stdout]
                assert not unknown, f"{' '.join(argv)}: has no {unknown}"
            elif name == "ray":  # a cluster's own commands (other machines): the flags exist
                r = subprocess.run([str(BIN / "ray"), argv[1], "--help"], capture_output=True, text=True, timeout=120)
                unknown = [a.split("=")[0] for a in argv[2:] if a.startswith("--") and a.split("=")[0] not in r.stdout]
                assert not unknown, f"{' '.join(argv)}: `ray {argv[1]}` has no {unknown}"
            elif name == "export":  # environment for the commands after it
                assert all(re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", a) for a in argv[1:]), argv
                continue
            else:
                pytest.fail(f"the README shows {' '.join(argv)!r}, which this test does not know how to try")
            assert r.returncode == 0, f"{' '.join(argv)}: {r.stdout[-2000:]} {r.stderr[-2000:]}"
            tried += 1
    assert tried >= 8


INLINE = re.compile(r"`(?:\.venv/bin/)?python (?:-m (bench(?:\.\w+)+)|(bench/\w+)\.py)([^`]*)`")


def test_the_inline_benchmark_commands_use_flags_their_parsers_take(monkeypatch):
    """`.venv/bin/python bench/x.py --flag v` quoted in the text: the flags parse (nothing runs)."""
    import argparse
    import importlib

    class Parsed(Exception):
        pass

    def catch(self, args=None, namespace=None):
        raise Parsed(self)

    found = INLINE.findall(INLINE_TEXT)
    assert len(found) >= 6
    checked = 0
    for module, path, rest in found:
        mod = importlib.import_module(module or path.replace("/", "."))
        if not hasattr(mod, "main"):  # a package run with -m: the main its __main__ calls
            source = (Path(mod.__file__).parent / "__main__.py").read_text()
            mod = importlib.import_module(re.search(r"from (\S+) import main", source).group(1))
        if "ArgumentParser(" not in Path(mod.__file__).read_text():  # no flags (bench.failures takes test ids)
            assert not rest.strip().startswith("-"), f"{mod.__name__} takes no flags, the README gives {rest!r}"
            continue
        with monkeypatch.context() as m:
            m.setattr(argparse.ArgumentParser, "parse_args", catch)
            with pytest.raises(Parsed) as p:
                mod.main([])
        parser = p.value.args[0]
        known = {o for a in parser._actions for o in a.option_strings}
        flags = [a.split("=")[0] for a in shlex.split(rest) if a.startswith("-")]
        assert set(flags) <= known, f"{mod.__name__}: the README passes {set(flags) - known}, which it does not take"
        checked += bool(flags)
    assert checked >= 4


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_the_dgds_recipe_for_vllm_serve_runs_as_written(tiny_model, tmp_path):
    block = next(b for b in bash_blocks() if "SEER_DGDS_ADDRESS" in b)
    dgds_port, vllm_port = free_port(), free_port()
    script = (block.replace("50061", str(dgds_port)).replace("8000", str(vllm_port))
              .replace("<model>", str(tiny_model)).replace("seer-dgds ", f"{BIN / 'seer-dgds'} ")
              .replace("python ", f"{sys.executable} "))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with open(tmp_path / "recipe.log", "w") as log:
        proc = subprocess.Popen(["bash", "-c", script], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{vllm_port}"
        deadline = time.monotonic() + 420
        while True:
            assert proc.poll() is None, (tmp_path / "recipe.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "vLLM not healthy within 420 s"
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        body = json.dumps({"model": str(tiny_model), "prompt": "sum 1 2 3 =", "max_tokens": 32,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json",
                                                                     "X-Request-Id": "readme-g0-s0"})
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())
        assert out["choices"][0]["text"] and out["usage"]["completion_tokens"] > 0
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        drafts = [float(x) for x in re.findall(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} (\S+)", metrics, re.M)]
        assert drafts and sum(drafts) > 0, "the DGDS proposer drafted nothing"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
