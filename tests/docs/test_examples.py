"""Every script under examples/ runs as documented: `python examples/<name>.py` with DATABASE_URL set.

Each script enqueues, runs a worker until its jobs are done, checks the outcome with its
own assertions and exits 0. It runs twice on the same database, since a user may run an
example again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NewDatabase
from tests.docs.docblocks import DOCS, ROOT, python_env

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_example_is_on_a_page() -> None:
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    assert EXAMPLES
    missing = [e.name for e in EXAMPLES if f"examples/{e.name}" not in pages]
    assert not missing, missing


@pytest.mark.parametrize("script", EXAMPLES, ids=[e.stem for e in EXAMPLES])
@pytest.mark.subprocess
def test_example_runs(script: Path, new_database: NewDatabase) -> None:
    url = new_database()
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
