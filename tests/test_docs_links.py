"""Every link in README.md and docs/*.md resolves: to a file or folder of the repository and, where
it names one, to a heading of the page it points at (no vLLM, no model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_docs_have_links_to_check():
    assert len(DOCS) >= 10 and sum(len(links(d)) for d in DOCS) >= 30


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_link_resolves_to_a_file_and_heading(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {broken}"


def test_every_docs_page_is_reachable_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [d.name for d in DOCS[1:] if f"docs/{d.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
