"""docs/failures.md's table claims only what tests back (no vLLM, no model).

Every row names the tests that exercise it (`file::test`, each must exist); every recovery bound
it quotes cites the file under bench/results/failures/ that the asserting test recorded
(`python -m bench.failures`), and each "within N s" and "measured X" number in the cell is one of
that file's bounds or measured values, at the precision shown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_results_index import numbers, table_after

ROOT = Path(__file__).resolve().parents[1]
FAILURES = ROOT / "bench" / "results" / "failures"


def rows() -> list[dict[str, str]]:
    header, body = table_after(ROOT / "docs" / "failures.md", "# Failure behaviour", "failure | what you see")
    return [dict(zip(header, r)) for r in body]


def _values(d) -> list[float]:
    if isinstance(d, bool):
        return []
    if isinstance(d, (int, float)):
        return [float(d)]
    if isinstance(d, dict):
        return [v for x in d.values() for v in _values(x)]
    if isinstance(d, list):
        return [v for x in d for v in _values(x)]
    return []


def _matches(cell_number: tuple[float, int], values: list[float]) -> bool:
    v, dec = cell_number
    return any(abs(v - e) <= 0.5 * 10 ** -dec + 1e-9 for e in values)


def test_the_table_has_its_columns_and_rows():
    rs = rows()
    assert len(rs) >= 9
    assert {"failure", "what you see", "what is lost", "asserted bound (measured)", "tested by"} <= set(rs[0])


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["failure"][:40])
def test_each_row_names_tests_that_exist(row):
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[[\w-]+\])?`", row["tested by"])
    assert cited, f"row {row['failure']!r} names no test as file::name"
    for path, name in cited:
        f = ROOT / path
        assert f.is_file(), f"{path} does not exist"
        assert re.search(rf"^(async )?def {name}\(", f.read_text(), re.M), f"{path} has no test {name}"


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["failure"][:40])
def test_each_quoted_bound_and_measurement_is_the_recorded_one(row):
    cell = row["asserted bound (measured)"]
    files = re.findall(r"`failures/([\w.]+\.json)`", cell)
    if not re.search(r"within|measured", cell):
        return  # nothing timed (the row says why)
    assert files, f"row {row['failure']!r} quotes a time but cites no bench/results/failures/ file"
    recs = [json.loads((FAILURES / f).read_text()) for f in files]
    bounds = [v for r in recs for v in _values(r["bounds_s"])]
    measured = [v for r in recs for v in _values(r["measured"])]
    for m in re.finditer(r"within ([\d.]+) s", cell):
        n = numbers(m.group(1))[0]
        assert _matches(n, bounds), f"{row['failure']!r}: bound {m.group(1)} s is not recorded"
    for m in re.finditer(r"measured ([^;)]*)", cell):
        for n in numbers(m.group(1)):
            assert _matches(n, measured), f"{row['failure']!r}: measured {n[0]} is in none of {files}"


def test_every_recorded_failure_file_is_cited():
    cited = {f for r in rows() for f in re.findall(r"`failures/([\w.]+\.json)`", r["asserted bound (measured)"])}
    recorded = {p.name for p in FAILURES.glob("*.json")}
    assert recorded <= cited, f"recorded but not quoted: {sorted(recorded - cited)}"
