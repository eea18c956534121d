"""The docs against the code, as a release checks them (make release-check; make test too).

- Every statement in README.md and docs/ that says a feature is "not yet" there, "does not
  exist", is "missing" or "planned" is listed in tests/docs/known_missing.py, with a
  check that the feature is still missing (or as a statement that is not about a feature);
  each listed statement is still on its page, and each check still finds the feature missing.
- Every treadle version the docs print is the control file's or a released one (a
  sql/treadle--X.sql of an earlier version); the changelog's first version is the control
  file's.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from tests.docs import known_missing
from tests.docs.docblocks import FENCE, ROOT

SAYS_MISSING = re.compile(
    r"\bnot yet\b|\bnot \w+ yet\b|\bdoes not exist\b|\bdo not exist\b|\bmissing\b|\bplanned\b", re.I
)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
VERSION_PAGES = [*PAGES, ROOT / "CONTRIBUTING.md"]
CONTROL_VERSION = re.search(r"^default_version\s*=\s*'([^']+)'", (ROOT / "treadle.control").read_text(), re.M)[1]  # type: ignore[index]
# a version, not part of a longer dotted run (an address such as 10.0.0.5)
VERSION = re.compile(r"(?<![\w.])(\d+\.\d+\.\d+)(?![\w-]|\.\d)")
BULLET = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")


def flat(text: str) -> str:
    return " ".join(text.split())


def prose(path: Path) -> str:
    """A page without its code blocks (blank lines in their place, so paragraphs stay apart)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())


def statements(path: Path) -> list[str]:
    """The statements of a page that say something is missing: a paragraph or an item of a
    list; an item that says it and ends in a colon stands for the items nested under it."""
    found = []
    for paragraph in re.split(r"\n\s*\n", prose(path)):
        items: list[tuple[int, list[str]]] = []  # (indent, lines) per item
        for line in paragraph.splitlines():
            if BULLET.match(line) or not items:
                items.append((len(line) - len(line.lstrip()), [line]))
            else:
                items[-1][1].append(line)
        lead: int | None = None  # the indent of a lead-in that speaks for the items under it
        for indent, lines in items:
            text = flat("\n".join(lines))
            if lead is not None and indent <= lead:
                lead = None
            if lead is not None:
                found.append(text)
            elif SAYS_MISSING.search(text):
                if text.rstrip("*").endswith(":") and BULLET.match(lines[0]):
                    lead = indent
                else:
                    found.append(text)
    return found


def entries() -> list[dict[str, str]]:
    return [*known_missing.MISSING, *known_missing.NOT_A_FEATURE]


STATEMENTS = [(page, s) for page in PAGES for s in statements(page)]
MISSING = known_missing.MISSING


def test_the_scan_finds_statements() -> None:
    # the lead-in of comparison.md's list of missing features speaks for its items
    assert any("wait for a signal" in s for _, s in STATEMENTS)
    assert len(STATEMENTS) >= 5


@pytest.mark.parametrize("page, statement", STATEMENTS, ids=[f"{p.relative_to(ROOT)}:{s[:50]}" for p, s in STATEMENTS])
def test_each_statement_of_something_missing_is_listed(page: Path, statement: str) -> None:
    name = str(page.relative_to(ROOT))
    listed = [e for e in entries() if e["page"] == name and flat(e["says"]) in statement]
    assert listed, (
        f"{name} says something is missing or not yet there, and tests/docs/known_missing.py does not "
        f"list it: {statement!r}. If it is still missing, add a [[missing]] entry whose check proves it; "
        "if it exists now, say so on the page."
    )


@pytest.mark.parametrize("entry", entries(), ids=[e["says"][:50] for e in entries()])
def test_each_listed_statement_is_still_on_its_page(entry: dict[str, str]) -> None:
    page = ROOT / entry["page"]
    assert page.exists(), f"known_missing.py: no page {entry['page']}"
    assert any(flat(entry["says"]) in s for s in statements(page)), (
        f"known_missing.py: {entry['page']} no longer says {entry['says']!r} where it says something is "
        "missing: drop the entry"
    )
    assert ("sql" in entry) != ("python" in entry) or "why" in entry, f"{entry['says']!r}: one check, or a why"


@pytest.mark.parametrize("entry", [e for e in MISSING if "python" in e], ids=lambda e: e["says"][:50])
def test_a_feature_listed_missing_is_not_in_the_package(entry: dict[str, str]) -> None:
    pattern = re.compile(entry["python"])
    hits = [
        f"{p.relative_to(ROOT)}"
        for p in sorted((ROOT / "python" / "src" / "treadle").rglob("*.py"))
        if pattern.search(p.read_text())
    ]
    assert not hits, f"{entry['page']} says {entry['says']!r} is missing, but {', '.join(hits)} has it"


@pytest.mark.parametrize("entry", [e for e in MISSING if "sql" in e], ids=lambda e: e["says"][:50])
def test_a_feature_listed_missing_is_not_in_the_extension(entry: dict[str, str], dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(entry["sql"]).fetchone()
    assert row is not None and row[0] is True, (
        f"{entry['page']} says {entry['says']!r} is missing, but the extension has it now "
        "(its check in tests/docs/known_missing.py found it): update the page and drop the entry"
    )


def released() -> set[str]:
    return {
        m[1]
        for p in (ROOT / "sql").glob("treadle--*.sql")
        if (m := re.fullmatch(r"treadle--(\d+\.\d+\.\d+)\.sql", p.name))
    }


def key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_versions_the_docs_print_are_this_one_or_released() -> None:
    known = {v for v in released() if key(v) < key(CONTROL_VERSION)} | {CONTROL_VERSION}
    bad = []
    for page in VERSION_PAGES:
        name, text = str(page.relative_to(ROOT)), page.read_text()
        # another project's versions, as the page names them
        others = {
            v
            for e in known_missing.OTHER_VERSION
            if e["page"] == name and flat(e["says"]) in flat(text)
            for v in VERSION.findall(e["says"])
        }
        for number, line in enumerate(text.splitlines(), 1):
            for m in VERSION.finditer(line):
                if m[1] in known or m[1] in others:
                    continue
                bad.append(f"{page.relative_to(ROOT)}:{number}: {m[1]}")
    assert not bad, (
        f"versions that are neither {CONTROL_VERSION} (treadle.control) nor released: "
        + "; ".join(bad)
        + " (another project's: an OTHER_VERSION entry in known_missing.py)"
    )


def test_each_other_version_is_still_on_its_page() -> None:
    for entry in known_missing.OTHER_VERSION:
        assert flat(entry["says"]) in flat((ROOT / entry["page"]).read_text()), (
            f"known_missing.py: {entry['page']} no longer says {entry['says']!r}: drop the entry"
        )


def test_the_changelog_starts_at_this_version() -> None:
    first = re.search(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert first is not None and first[1] == CONTROL_VERSION, (
        f"CHANGELOG.md's first version is {first and first[1]}, treadle.control's {CONTROL_VERSION}"
    )


def test_the_package_is_this_version() -> None:
    pyproject = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert pyproject is not None and pyproject[1] == CONTROL_VERSION
