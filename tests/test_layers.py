"""The layout shows the architecture: every import in seer/ runs down the layers, none back up,
none into the repository's bench/, and the config and the pure parts import without any heavy
dependency loaded."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SEER = Path(__file__).resolve().parents[1] / "seer"

# Layer of each top-level part of the package (docs: README, "Layout").
LAYERS = {
    "types": 0, "procs": 0, "plugins": 0, "request_ids": 0,
    "compat": 0,
    "scheduler": 1, "dgds": 1, "kvpool": 1, "tasks": 1, "model": 1,
    "fleet": 2, "trainer": 2,
    "rollout": 3,
    "config": 4, "rundir": 4, "metrics_log": 4, "job": 4, "loop": 4, "cli": 4, "bench_cli": 4, "watch": 4, "config_help": 4,
    # The simulator runs the production scheduler and statistics and writes the trace format: it sits
    # on top, and nothing in seer/ imports it.
    "sim": 5,
}
# Imports between parts of one layer that the design allows: the ground's helpers read and write
# the shared records; the embedded model is warm-started on the built-in task.
ALLOWED_SIDEWAYS = {("procs", "types"), ("model", "tasks")}
HEAVY = ("grpc", "mooncake", "vllm", "torch", "transformers", "aiohttp", "megatron", "ray",
         "tensorboard", "wandb", "mlflow", "prometheus_client")  # trackers load only when a run turns them on


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "seer" and len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every `seer.…` module this file imports, at any depth (lazy imports count too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "seer"]
    return [(n, m) for n, m in out if m == "seer" or m.startswith(("seer.", "bench"))]


def _sources():
    return [p for p in SEER.rglob("*.py") if "proto" not in p.parts]


def test_every_part_of_the_package_has_a_layer():
    parts = {p.relative_to(SEER).parts[0].removesuffix(".py") for p in _sources()} - {"__init__"}
    assert parts <= set(LAYERS), f"give these a layer in LAYERS (and the README's Layout): {parts - set(LAYERS)}"


def test_no_import_runs_up_a_layer_or_sideways():
    bad = []
    for path in _sources():
        rel = path.relative_to(SEER)
        me = rel.parts[0].removesuffix(".py")
        if me == "__init__":
            continue
        for line, module in _imports(path):
            other = _part(module)
            if other is None or other == me or other not in LAYERS:
                continue
            up = LAYERS[other] > LAYERS[me]
            sideways = LAYERS[other] == LAYERS[me] and LAYERS[me] < 4 and (me, other) not in ALLOWED_SIDEWAYS
            if up or sideways:
                bad.append(f"{rel}:{line} ({me}, layer {LAYERS[me]}) imports {module} ({other}, layer {LAYERS[other]})")
    assert not bad, "\n".join(bad)


def test_the_package_graph_has_no_cycle():
    graph: dict[str, set[str]] = {p: set() for p in LAYERS}
    for path in _sources():
        me = path.relative_to(SEER).parts[0].removesuffix(".py")
        for _, module in _imports(path):
            other = _part(module)
            if other in LAYERS and other != me and me in graph:
                graph[me].add(other)
    seen, stack = set(), []

    def visit(n):
        if n in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(n):] + [n])}")
        if n in seen:
            return
        stack.append(n)
        for m in graph[n]:
            visit(m)
        stack.pop()
        seen.add(n)

    for n in graph:
        visit(n)


def test_no_module_of_the_package_imports_the_benchmarks():
    """bench/ is not installed: a `bench` import anywhere in seer/ (the simulator included) would
    break an installed package."""
    bad = [f"{p.relative_to(SEER)}:{line} imports {m}" for p in _sources() for line, m in _imports(p)
           if m == "bench" or m.startswith("bench.")]
    assert not bad, "\n".join(bad)
    assert (SEER / "sim" / "simulate.py").is_file()  # the simulator is one of the modules checked


# Inside seer.dgds: the client runs inside vLLM and the server in its own process, so neither
# imports the other; what they share is the API (proto), seer.dgds.wire, the trees and the records.
DGDS_APART = {
    "client": ("seer.dgds.server", "seer.dgds.vllm"),
    "server": ("seer.dgds.client",),
    "wire.py": ("seer.dgds.server", "seer.dgds.client", "seer.dgds.vllm", "seer.dgds.tree"),
    "proto": ("seer.dgds.server", "seer.dgds.client", "seer.dgds.vllm"),
}


def test_the_dgds_client_and_server_import_nothing_of_each_other():
    bad = []
    for part, banned in DGDS_APART.items():
        root = SEER / "dgds" / part
        for path in ([root] if root.suffix == ".py" else sorted(root.rglob("*.py"))):
            for line, module in _imports(path):
                if module.startswith(banned):
                    bad.append(f"{path.relative_to(SEER)}:{line} imports {module}")
    assert not bad, "\n".join(bad)
    # and at run time: importing the client loads no server module (nor does the server load the client)
    for module, banned in (("seer.dgds.client.draft_client", "seer.dgds.server"),
                           ("seer.dgds.server.grpc_server", "seer.dgds.client")):
        code = f"import sys, {module}\nprint(','.join(sorted(m for m in sys.modules if m.startswith('{banned}'))))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "", f"import {module} loaded {r.stdout.strip()}"


@pytest.mark.parametrize("module", ["seer.config", "seer.scheduler", "seer.types", "seer.tasks", "seer.plugins",
                                    "seer.rundir", "seer.dgds.server.config", "seer.dgds.wire", "seer.kvpool.config",
                                    "seer.watch.run", "seer.trainer.config", "seer.trainer.algorithms", "seer.trainer.metrics", "seer.trainer.errors",
                                    "seer.sim.simulate", "seer.sim.multiturn"])
def test_light_modules_import_nothing_heavy(module):
    code = (f"import sys, {module}\n"
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
            "print(','.join(heavy))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"import {module} loaded {r.stdout.strip()}"
