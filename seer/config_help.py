"""`seer-run --print-config`: every config key with its default and a one-line description, read
from the config dataclasses themselves (each field's comment), so the list cannot drift from the
code. A field's description is its trailing comment, or the comment block right above it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import tokenize
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class KeyHelp:
    key: str
    type: str
    default: object
    description: str | None


@functools.cache
def field_comments(cls) -> dict[str, str]:
    """Field name -> its comment in `cls`'s source (trailing, else the block right above)."""
    src = inspect.getsource(cls)
    lines = src.splitlines()
    comments = {t.start[0]: t.string.lstrip("#").strip()
                for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT}
    out = {}
    for node in ast.parse(src).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = " ".join(comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments)
        if not text:
            above, n = [], node.lineno - 1
            while n in comments and lines[n - 1].lstrip().startswith("#"):
                above.insert(0, comments[n])
                n -= 1
            text = " ".join(above)
        if text:
            out[node.target.id] = text
    return out


def _type_name(tp) -> str:
    return (str(tp).replace("typing.", "") if typing.get_origin(tp) is not None or not hasattr(tp, "__name__")
            else tp.__name__)


def config_keys(cfg=None) -> list[KeyHelp]:
    """Every leaf key of RunConfig, with the value it takes by default (or in `cfg`)."""
    from seer.config import RunConfig

    out: list[KeyHelp] = []

    def walk(obj, prefix: str) -> None:
        hints = typing.get_type_hints(type(obj))
        notes = field_comments(type(obj))
        for f in dataclasses.fields(obj):
            value, key = getattr(obj, f.name), prefix + f.name
            if dataclasses.is_dataclass(value):
                walk(value, key + ".")
            else:
                out.append(KeyHelp(key, _type_name(hints[f.name]), value, notes.get(f.name)))

    walk(cfg if cfg is not None else RunConfig(), "")
    return out


def _yaml_value(v) -> str:
    import yaml

    if isinstance(v, tuple):
        v = list(v)
    return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def one_line(text: str | None, width: int = 110) -> str:
    """The description's first sentence, cut to `width`."""
    if not text:
        return ""
    first = text.split(". ")[0].rstrip(".")
    return first if len(first) <= width else first[: width - 1].rstrip() + "…"


def render(cfg=None) -> str:
    """YAML you can start a config file from: each section, each key = its value, # what it does."""
    lines, section = [], ""
    for k in config_keys(cfg):
        head, _, leaf = k.key.rpartition(".")
        if head != section:
            section = head
            lines.append(f"{head}:")
        indent = "  " if head else ""
        lines.append(f"{indent}{leaf}: {_yaml_value(k.default)}  # {k.type}: {one_line(k.description)}".rstrip())
    return "\n".join(lines) + "\n"
