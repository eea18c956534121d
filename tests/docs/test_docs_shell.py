"""Every ```sh block of the documentation runs in bash, or is listed here with the reason it cannot.

A block runs with `bash -euo pipefail` in a temporary folder, with DATABASE_URL naming a
fresh database that has the extension and the project's virtual environment first on
PATH. A ```text block right after it is what it must print.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXTENSION_VERSION, NewDatabase
from tests.docs.docblocks import ROOT, Block, check_outputs, page_blocks, python_env

# Blocks the suite cannot run as written, by their exact text, and what covers them instead.
NOT_RUN = {
    "make install": "writes into the server's share directory; `make test` runs it before any test",
    "make demo": "runs until Ctrl-C; tests/dashboard/test_demo.py runs scripts/demo, which it calls",
    'pg_config=$(scripts/pgserver)\nmake install PG_CONFIG="$pg_config"\n'
    'PG_CONFIG="$pg_config" scripts/pgcluster start .build/pg16-cluster': (
        "installs PostgreSQL 16 under the checkout's .build/ and leaves a server running; "
        "`make test-pg16` (part of `make test`) and tests/dashboard/test_demo_pgserver.py run these scripts"
    ),
    "python -m pip install -e '.[dashboard]'": (
        "installs into the active environment; `make test` installs the package the same way"
    ),
    "treadle dashboard --port 5000": ("serves until stopped, on a port another program may hold"),
    "treadle worker examples/worker_process.py": (
        "runs until stopped; examples/worker_process.py runs this command and stops it with SIGTERM"
    ),
    "treadle status --watch": (
        "redraws until Ctrl-C; tests/cli/test_reading.py runs it on a terminal, sees a new job appear, and stops it"
    ),
    "treadle worker tasks --metrics-port 9181": (
        "runs until stopped, on a port another program may hold; tests/metrics/test_serving.py runs "
        "a worker with --metrics-port and scrapes it"
    ),
    "treadle dashboard --port 5000 --read-only": ("serves until stopped, on a port another program may hold"),
    f'psql "postgresql://app_owner@db.example.com/app" -v ON_ERROR_STOP=1 -f dist/treadle-{EXTENSION_VERSION}.sql': (
        "names the reader's server; tests/install/test_plain_install.py runs psql -f on this script "
        "as a role that has only CREATE on its database"
    ),
}

# `python examples/<name>.py` (after an optional DATABASE_URL=...): test_examples.py runs it.
EXAMPLE_RUN = re.compile(r"^(?:DATABASE_URL=\S+ )?python (examples/\w+\.py)$")

BLOCKS = [b for _, blocks in page_blocks("sh") for b in blocks]
EXAMPLE_BLOCKS = [b for b in BLOCKS if EXAMPLE_RUN.match(b.code.strip())]
RUN = [b for b in BLOCKS if b.code.strip() not in NOT_RUN and b not in EXAMPLE_BLOCKS]


def test_every_listed_block_exists() -> None:
    present = {b.code.strip() for b in BLOCKS}
    assert set(NOT_RUN) <= present, sorted(set(NOT_RUN) - present)
    assert RUN, "some shell blocks run"


@pytest.mark.parametrize("block", EXAMPLE_BLOCKS, ids=[b.where for b in EXAMPLE_BLOCKS])
def test_example_command_names_an_example(block: Block) -> None:
    match = EXAMPLE_RUN.match(block.code.strip())
    assert match and (ROOT / match.group(1)).is_file(), f"{block.where}: no such example"


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
@pytest.mark.subprocess
def test_shell_block_runs(block: Block, new_database: NewDatabase, tmp_path: Path) -> None:
    url = new_database()
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        capture_output=True,
        text=True,
        env=python_env(url),
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, f"{block.where}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    check_outputs([block], [run.stdout])
