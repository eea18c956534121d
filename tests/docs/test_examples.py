"""Every script under examples/ runs as documented: `python examples/<name>.py` with DATABASE_URL set.

Each script enqueues, runs a worker until its jobs are done, checks the outcome with its
own assertions and exits 0. It runs twice on the same database, since a user may run an
example again. It runs as an application's role, not as a superuser: one that owns its
own tables (CREATE on schema public) and that the owner gave treadle's worker and admin
parts (docs/operations.md#roles-and-grants), as an application that enqueues, works and
prunes would have.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.conftest import NewDatabase, as_role
from tests.docs.docblocks import DOCS, ROOT, python_env

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_example_is_on_a_page() -> None:
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    assert EXAMPLES
    missing = [e.name for e in EXAMPLES if f"examples/{e.name}" not in pages]
    assert not missing, missing


@pytest.mark.parametrize("script", EXAMPLES, ids=[e.stem for e in EXAMPLES])
@pytest.mark.subprocess
def test_example_runs(script: Path, new_database: NewDatabase, make_role: Callable[[str], str]) -> None:
    url = new_database()
    app = make_role("example")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{app}"')
        conn.execute("SELECT treadle.grant_worker(%s), treadle.grant_admin(%s)", (app, app))
    url = as_role(url, app)
    for run_number in (1, 2):
        run = subprocess.run(
            [sys.executable, str(script.relative_to(ROOT))],
            capture_output=True,
            text=True,
            env=python_env(url),
            cwd=ROOT,
            timeout=150,
        )
        assert run.returncode == 0, f"run {run_number} of {script.name}:\n{run.stdout}\n{run.stderr}"
        assert run.stdout.strip(), f"{script.name} prints what it did"
