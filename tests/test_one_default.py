"""One default per setting: a config key's default is written once, in its config dataclass.

A function or another dataclass in seer/ that takes a parameter of the same name with the same
literal default is that default written a second time (as `chunk_size` once was, in nine places):
change one and the other silently disagrees. Such a signature takes the config's value instead
(`chunk_size: int = DEFAULTS.chunk_size`, `kv_pool: bool = PlacementConfig.kv_pool`), or has
no default. The scan is mechanical: a literal default of a config field's name and value,
anywhere in seer/ outside the config dataclasses, unless the config field itself reads its
default from elsewhere (then that one literal is the single source).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

from seer.config import RunConfig

SEER = Path(__file__).resolve().parents[1] / "seer"

# Names that are also every function's own, unrelated parameter (a port probe's host, a loss's
# temperature, a helper's seed): the same literal there is not the config's setting written twice.
GENERIC = {"seed", "host", "dtype", "temperature", "mode", "name", "timeout_s", "enabled"}



def _config_classes() -> list[type]:
    """Every dataclass in RunConfig's tree (the classes whose fields are config keys)."""
    out: list[type] = []

    def walk(cls: type) -> None:
        if cls in out:
            return
        out.append(cls)
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
                if dataclasses.is_dataclass(value):
                    walk(type(value))

    walk(RunConfig)
    return out


def _literal(node: ast.AST | None):
    """The value of a literal default (None when it is not one, or is None itself)."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _written_defaults(cls: type) -> dict[str, bool]:
    """Field name -> whether `cls` writes its default as a literal (rather than reading it from elsewhere)."""
    tree = ast.parse(inspect.getsource(cls).strip())
    return {n.target.id: _literal(n.value) is not None
            for n in tree.body[0].body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _settings() -> dict[str, list]:
    """name -> [default] of every config key whose config class writes the default as a literal."""
    out: dict[str, list] = {}
    for cls in _config_classes():
        literal = _written_defaults(cls)
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING or f.default is None or not literal.get(f.name):
                continue
            out.setdefault(f.name, []).append(f.default)
    return out


def _defaults_in(tree: ast.AST, config_names: set[str]):
    """(line, name, value) of every literal parameter default and dataclass-style field default
    in `tree`, except inside the config dataclasses themselves."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = [*zip(pos[len(pos) - len(a.defaults):], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
            for arg, default in pairs:
                if default is not None:
                    yield default.lineno, arg.arg, _literal(default)
        elif isinstance(node, ast.ClassDef) and node.name not in config_names:
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    yield st.lineno, st.target.id, _literal(st.value)


def _repeats() -> list[str]:
    settings = _settings()
    config_names = {c.__name__ for c in _config_classes()}
    found = []
    for path in sorted(SEER.rglob("*.py")):
        if "proto" in path.parts:
            continue
        rel = str(path.relative_to(SEER.parent))
        for line, name, value in _defaults_in(ast.parse(path.read_text()), config_names):
            if value is None or value in ("", ()) or name in GENERIC or name not in settings:
                continue
            if any(type(value) is type(d) and value == d for d in settings[name]):
                found.append((rel, line, name, value))
    return found


def test_no_config_default_is_written_a_second_time():
    bad = [f"{rel}:{line}: {name}={value!r} repeats the config's default"
           for rel, line, name, value in _repeats()]
    assert not bad, "take the config's value (e.g. `= DEFAULTS.x`) instead:\n" + "\n".join(bad)


def test_chunk_size_has_one_default():
    """The setting that was written nine times: only SchedulerConfig (and the run's own choice for
    the embedded model in RunConfig) say what it is."""
    sources = [p for p in SEER.rglob("*.py") if "chunk_size: int | None = 8192" in p.read_text()
               or "chunk_size=8192" in p.read_text() or "chunk_size: int = 8192" in p.read_text()]
    assert [str(p.relative_to(SEER.parent)) for p in sources] == ["seer/scheduler/config.py"]
