"""Prometheus text exposition, as vLLM's and Mooncake's /metrics serve it: one parser for all.

A hand-rolled parser, not prometheus_client's: it parses only the lines a caller names (a cheap
prefix test), which keeps the scheduler's telemetry poll off the driver's critical path.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str, names: tuple[str, ...] | None = None) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line as (metric name, labels, value); comments skipped. With `names`, only lines
    starting with one of them are parsed (a cheap prefix test; callers still match names exactly)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if names is not None and not line.startswith(names):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.append((m.group("name"), labels, value))
    return out
