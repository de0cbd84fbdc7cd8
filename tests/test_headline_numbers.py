"""The README's headline table quotes only recorded numbers: every number in a row's "measured"
cell is one of the numbers in the files that row links, at the precision shown (no vLLM, no model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NUM = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def shown(text: str) -> list[tuple[str, float, float]]:
    """(as written, value, half a unit of the last digit shown) for each number in `text`."""
    out = []
    for m in NUM.finditer(text.replace("**", "")):
        s = m.group().replace(",", "")
        mant, _, exp = s.partition("e")
        dec = len(mant.split(".")[1]) if "." in mant else 0
        scale = 10.0 ** int(exp) if exp else 1.0
        out.append((m.group(), float(s), 0.5 * 10.0 ** -dec * scale))
    return out


def recorded(path: Path) -> list[float]:
    """Every number a recorded file holds: JSON values (leaves, and lines of JSONL), or the numbers in its text."""
    text = path.read_text()
    values: list[float] = []

    def walk(o):
        if isinstance(o, bool):
            return
        if isinstance(o, (int, float)):
            values.append(float(o))
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    if path.suffix in (".json", ".jsonl"):
        for chunk in ([text] if path.suffix == ".json" else text.splitlines()):
            if chunk.strip():
                walk(json.loads(chunk))
    values += [v for _, v, _ in shown(text)]
    return values


def headline_rows() -> list[tuple[str, str, list[Path]]]:
    text = README.read_text()
    body = text[text.index("## Headline numbers"):]
    rows = []
    for line in body.splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("what", "---"):
            links = [ROOT / t for t in re.findall(r"\]\((bench/results/[^)]+)\)", cells[2])]
            rows.append((cells[0], cells[1], links))
    return rows


def test_the_headline_table_has_rows():
    assert len(headline_rows()) >= 8


@pytest.mark.parametrize("what,measured,links", headline_rows(), ids=lambda x: x[:40] if isinstance(x, str) else "")
def test_every_headline_number_is_in_the_files_its_row_links(what, measured, links):
    assert links and all(p.is_file() for p in links), f"{what}: its row must link recorded files: {links}"
    pool = [v for p in links for v in recorded(p)]
    # the paper's figures are quoted beside ours; they come from the paper, not a recording
    ours = re.sub(r"\(paper[^)]*\)", "", measured)
    missing = [s for s, v, tol in shown(ours) if not any(abs(v - r) <= tol + 1e-12 for r in pool)]
    assert not missing, f"{what}: {missing} are not in {[p.relative_to(ROOT).as_posix() for p in links]}"
