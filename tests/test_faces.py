"""One route from each face to the database, one way to write a value: the CLI and the
dashboard say a wait, a time, a duration and a queue's limits the same way (treadle._display),
the dashboard imports nothing from the CLI, and neither restates a statement of _sql.py."""

from __future__ import annotations

import ast
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import treadle.dashboard
from treadle import _display
from treadle.cli import age as cli_age
from treadle.dashboard import formatting


@pytest.mark.parametrize(
    "wait, text",
    [
        (timedelta(seconds=4.24), "4.2 s"),
        (timedelta(seconds=0.099), "0 s"),
        (timedelta(seconds=0.35), "0.3 s"),
        (timedelta(seconds=5), "5 s"),
        (timedelta(seconds=9.99), "9.9 s"),
        (timedelta(seconds=10.9), "10 s"),
        (timedelta(seconds=59.99), "59 s"),
        (timedelta(seconds=60), "1 min"),
        (timedelta(seconds=185), "3 min 5 s"),
        (timedelta(minutes=3), "3 min"),
        (timedelta(hours=2, minutes=10, seconds=3), "2 h 10 min"),
        (timedelta(hours=2, seconds=59), "2 h"),
        (timedelta(days=3, hours=4), "3 d 4 h"),
        (timedelta(days=3, minutes=5), "3 d"),
        (timedelta(seconds=-1), "0 s"),
    ],
)
def test_a_wait_reads_the_same_on_both_faces(wait: timedelta, text: str) -> None:
    assert cli_age(wait) == text
    assert formatting.age(wait) == text


def test_a_missing_value_is_each_face_s_placeholder() -> None:
    assert cli_age(None) == "-"
    assert formatting.age(None) == "—"
    assert _display.when(None) == "-"
    assert formatting.when(None) == "—"


def test_a_time_keeps_its_offset_in_the_cli_and_is_utc_on_the_page() -> None:
    at = datetime(2026, 12, 4, 23, 30, 5, 999_999, tzinfo=timezone(timedelta(hours=2)))
    assert _display.when(at) == "2026-12-04 23:30:05+02:00"
    assert formatting.when(at) == "2026-12-04 21:30:05"


@pytest.mark.parametrize(
    "value",
    [timedelta(seconds=1), timedelta(seconds=90), timedelta(minutes=1), timedelta(days=7), timedelta(seconds=1.5)],
)
def test_a_duration_reads_back_as_it_is_written(value: timedelta) -> None:
    assert _display.duration(_display.span(value), "x") == value


@pytest.mark.parametrize("text", ["", "7", "7x", "1h 30", "9" * 400 + "w"])
def test_a_bad_duration_says_how_to_write_one(text: str) -> None:
    with pytest.raises(_display.DurationError, match="retain failed: "):
        _display.duration(text, "retain failed")


def test_limits_read_in_one_line() -> None:
    none = dict.fromkeys(("concurrency", "rate_limit", "rate_period", "max_depth", "retain_completed", "retain_failed"))
    assert _display.limits_text(none) == "-"
    every = {
        "concurrency": 2,
        "rate_limit": 10,
        "rate_period": timedelta(seconds=1),
        "max_depth": 10_000,
        "retain_completed": timedelta(days=7),
        "retain_failed": timedelta(days=30),
    }
    assert _display.limits_text(every) == (
        "concurrency 2, rate 10/1s, max depth 10,000, keep completed 7d, keep failed 30d"
    )


def test_the_dashboard_imports_nothing_from_the_cli() -> None:
    imported: list[str] = []
    for source in Path(treadle.dashboard.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                names = [module + "." + a.name for a in node.names] if node.module is None else [module]
                imported.extend(f"{source.name}: {name}" for name in names if "cli" in name.split(".")[:4])
            elif isinstance(node, ast.Import):
                imported.extend(f"{source.name}: {a.name}" for a in node.names if a.name.startswith("treadle.cli"))
    # its own cli.py (the `treadle dashboard` command) is the dashboard's, not treadle.cli
    assert [entry for entry in imported if not entry.endswith(": .cli")] == []


def test_the_faces_state_no_statement_the_client_sends() -> None:
    """The operator controls and the readers both faces show are written once, in _sql.py."""
    shared = re.compile(
        r"treadle\.(pause|resume|set_queue|cancel|retry|cancel_workflow|explain|explain_run|version)\s*\("
        r"|FROM\s+treadle\.(live_workers|schedules)\b"
    )
    package = Path(treadle.dashboard.__file__).parent.parent
    found = [
        f"{source.relative_to(package)}: {match.group(0)}"
        for face in ("cli", "dashboard")
        for source in sorted((package / face).glob("*.py"))
        for match in shared.finditer(source.read_text(encoding="utf-8"))
    ]
    assert found == []
    assert shared.search((package / "_sql.py").read_text(encoding="utf-8"))  # the pattern finds what it looks for
