"""Every relative link in the documentation, the README and the changelog leads somewhere.

A link to a file must name a file or folder of the repository; a link with an anchor
(`page.md#section`) must name a heading of that page, spelt as GitHub spells anchors.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.docs.docblocks import FENCE, ROOT, pages

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
DOCUMENTS = [*pages(), ROOT / "README.md"]


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    text = FENCE.sub("", path.read_text())
    seen: Counter[str] = Counter()
    found = set()
    for title in HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", path.read_text())) if not re.match(r"^[a-z]+:", target)]


CASES = [(doc, target) for doc in DOCUMENTS for target in links(doc)]


def test_there_are_links() -> None:
    assert len(CASES) > 50


@pytest.mark.parametrize("doc, target", CASES, ids=[f"{d.relative_to(ROOT)}->{t}" for d, t in CASES])
def test_link_resolves(doc: Path, target: str) -> None:
    path_part, _, anchor = target.partition("#")
    destination = (doc.parent / path_part).resolve() if path_part else doc
    assert destination.exists(), f"{doc.relative_to(ROOT)}: {target} names nothing"
    assert destination.is_relative_to(ROOT), f"{doc.relative_to(ROOT)}: {target} leaves the repository"
    if anchor:
        assert destination.suffix == ".md", f"{doc.relative_to(ROOT)}: {target} has an anchor on a non-page"
        assert anchor in anchors(destination), (
            f"{doc.relative_to(ROOT)}: no heading #{anchor} in {path_part or 'this page'}"
        )
