"""The README's SQL session runs as written, in psql, on a database without treadle."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.conftest import NewDatabase

README = Path(__file__).resolve().parents[2] / "README.md"


def sql_blocks(text: str) -> list[str]:
    return re.findall(r"```sql\n(.*?)```", text, flags=re.S)


@pytest.fixture
def empty_db(new_database: NewDatabase) -> str:
    return new_database(template=None)


@pytest.mark.subprocess
def test_readme_psql_session(empty_db: str) -> None:
    blocks = sql_blocks(README.read_text())
    assert blocks, "the README has a psql session"
    for block in blocks:
        run = subprocess.run(
            ["psql", empty_db, "-X", "-v", "ON_ERROR_STOP=1"], input=block, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
    with psycopg.connect(empty_db) as conn:
        row = conn.execute("select name, state, result from treadle.jobs").fetchone()
    assert row == ("send_email", "completed", {"sent": True})
