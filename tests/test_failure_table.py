"""docs/failures.md's table claims only what tests back (no vLLM, no model).

Every row names the tests that exercise it (`file::test`, each must exist). Every recovery bound
it quotes is one a failure test asserts: the row cites the file under bench/results/failures/
that test recorded (`python -m bench.failures`), states each of that file's bounds in the words
`Bound.text` renders from tests/failure_record.py's RECORDS (which the test's assertion uses),
and states no other; each "measured X" number is one of that file's measured values. The recorded
files themselves must hold the bounds and the measurements RECORDS names today, so a test whose
bound or measurements changed since its file was recorded fails here until it is recorded again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from failure_record import FAILURES, RECORDS, bounds_doc
from test_results_index import numbers, table_after

ROOT = Path(__file__).resolve().parents[1]
# a bound as Bound.text renders it: "within 10 s", "at most 2x the previous update + 15 s"
BOUND_TEXT = re.compile(r"within [\d.]+ s|at most [\d.]+x [^;()]*? \+ [\d.]+ s")


def rows() -> list[dict[str, str]]:
    header, body = table_after(ROOT / "docs" / "failures.md", "# Failure behaviour", "failure | what you see")
    return [dict(zip(header, r)) for r in body]


def _cited(row: dict[str, str]) -> list[str]:
    """The recorded files a row cites (their names in RECORDS)."""
    return [f.removesuffix(".json") for f in re.findall(r"`failures/([\w.]+\.json)`", row["asserted bound (measured)"])]


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
def test_each_row_states_only_bounds_its_tests_assert(row):
    cell = row["asserted bound (measured)"]
    names = _cited(row)
    if not re.search(r"within|at most|measured", cell):
        assert not names
        return  # nothing timed (the row says why)
    assert names, f"row {row['failure']!r} quotes a time but cites no bench/results/failures/ file"
    texts = set()
    for name in names:
        assert name in RECORDS, f"{name}.json is cited, but no test records it (tests/failure_record.py)"
        spec = RECORDS[name]
        assert f"`{spec.test}`" in row["tested by"], f"{name}.json is recorded by {spec.test}, not named in the row"
        texts |= {b.text() for b in spec.bounds.values()}
    stated = set(BOUND_TEXT.findall(cell))
    assert stated <= texts, f"{row['failure']!r} states {sorted(stated - texts)}, which no cited test asserts"


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_each_asserted_bound_is_stated_where_its_file_is_cited(name):
    stated = {t for r in rows() if name in _cited(r) for t in BOUND_TEXT.findall(r["asserted bound (measured)"])}
    missing = sorted({b.text() for b in RECORDS[name].bounds.values()} - stated)
    assert not missing, f"no row citing {name}.json states {missing}"


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["failure"][:40])
def test_each_quoted_measurement_is_the_recorded_one(row):
    cell = row["asserted bound (measured)"]
    files = [f"{name}.json" for name in _cited(row)]
    measured = [v for f in files for v in _values(json.loads((FAILURES / f).read_text())["measured"])]
    for m in re.finditer(r"measured ([^;)]*)", cell):
        for n in numbers(m.group(1)):
            assert _matches(n, measured), f"{row['failure']!r}: measured {n[0]} is in none of {files}"


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_each_recorded_file_holds_what_its_test_asserts_and_measures_now(name):
    spec = RECORDS[name]
    path = FAILURES / f"{name}.json"
    assert path.is_file(), f"{path} was never recorded: python -m bench.failures '{spec.test}'"
    doc = json.loads(path.read_text())
    again = f"record it again: python -m bench.failures '{spec.test}'"
    assert doc["test"] == spec.test, again
    assert set(doc["measured"]) == spec.keys(), f"{name}.json measured {sorted(doc['measured'])}; {again}"
    assert doc["bounds"] == bounds_doc(spec, doc["measured"]), f"{name}.json's bounds are not RECORDS'; {again}"
    for key, b in spec.bounds.items():  # what was measured passed the bound
        base = doc["measured"][b.base] if b.factor else 0.0
        assert doc["measured"][f"{key}_s"] < b.limit(base), (name, key)


def test_every_recorded_failure_file_is_cited():
    cited = {name for r in rows() for name in _cited(r)}
    recorded = {p.stem for p in FAILURES.glob("*.json")}
    assert recorded <= set(RECORDS), f"recorded by no test: {sorted(recorded - set(RECORDS))}"
    assert recorded <= cited, f"recorded but not quoted: {sorted(recorded - cited)}"


def test_bench_failures_runs_every_test_that_records():
    """`python -m bench.failures` without arguments re-records every file RECORDS names."""
    from bench.failures import TESTS

    for name, spec in RECORDS.items():
        path, node = spec.test.split("::", 1)
        assert any(t in (path, f"{path}::{node.split('[')[0]}", spec.test) for t in TESTS), (name, spec.test)
