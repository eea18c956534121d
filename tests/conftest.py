"""Fixtures shared by every test: a real PostgreSQL server and fresh databases.

The server is the one `make test` started (TREADLE_TEST_SERVER, a postgres URL),
or, when that is unset, a throwaway cluster this session starts itself with
scripts/pgcluster (the extension must be installed: `make install`).
Each test gets a database of its own, cloned from a template that has
`CREATE EXTENSION treadle` done, so tests never see each other's jobs. With
TREADLE_TEST_INSTALL=plain (scripts/run-tests sets it) the template has the plain SQL
install instead, made by a role that has only CREATE on it; tests marked
`extension_only` are skipped then.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = f"treadle_template_{os.getpid()}"
INSTALL = os.environ.get("TREADLE_TEST_INSTALL", "extension")  # or "plain"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if INSTALL == "plain":
        skip = pytest.mark.skip(reason="an extension's own behaviour: this run tests the plain SQL install")
        for item in items:
            if item.get_closest_marker("extension_only"):
                item.add_marker(skip)


def with_db(url: str, dbname: str) -> str:
    """The same server URL, naming another database."""
    return url.rsplit("/", 1)[0] + "/" + dbname


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    url = os.environ.get("TREADLE_TEST_SERVER")
    if url:
        yield url
        return
    folder = tempfile.mkdtemp(prefix="treadle-test-")
    script = str(ROOT / "scripts" / "pgcluster")
    url = subprocess.run([script, "start", folder], check=True, capture_output=True, text=True).stdout.strip()
    try:
        yield url
    finally:
        subprocess.run([script, "stop", folder], check=False)


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> Iterator[str]:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    if INSTALL == "plain":
        from scratch import install_plain

        install_plain(pg_server, TEMPLATE)
    else:
        with psycopg.connect(with_db(pg_server, TEMPLATE), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION treadle")
    yield TEMPLATE
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


@pytest.fixture
def dsn(pg_server: str, template_db: str) -> Iterator[str]:
    """A fresh database with treadle installed; dropped after the test."""
    name = f"treadle_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield with_db(pg_server, name)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
