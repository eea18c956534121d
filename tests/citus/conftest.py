"""Fixtures for the tests that run on a real Citus cluster (make test-citus).

scripts/citus-tests starts a coordinator and two worker nodes (scripts/citus-cluster),
makes a database on them and names it in TREADLE_CITUS_URL (the coordinator's URL) and
the cluster's directory in TREADLE_CITUS_DIR. The first test to connect creates treadle
there and runs `treadle.distribute()`, once for the session. Without TREADLE_CITUS_URL
(make test, make test-fast) nothing here is collected: these tests need the cluster.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg.rows import dict_row

CITUS_URL = os.environ.get("TREADLE_CITUS_URL", "")
CITUS_DIR = os.environ.get("TREADLE_CITUS_DIR", "")

if not CITUS_URL:
    collect_ignore_glob = ["test_*.py"]


def node_url(node: str) -> str:
    """The URL of the same database on one worker node (w1, w2) of the cluster."""
    port = (Path(CITUS_DIR) / node / "port").read_text().strip()
    parts = urlsplit(CITUS_URL)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))


@pytest.fixture(scope="session")
def distributed() -> str:
    """What the session's `treadle.distribute()` answered, on a database where it ran."""
    with psycopg.connect(CITUS_URL, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS treadle")
        row = conn.execute("SELECT treadle.distribute()").fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def conn(distributed: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """An autocommit connection to the coordinator, rows as dicts."""
    with psycopg.connect(CITUS_URL, autocommit=True, row_factory=dict_row) as c:
        yield c


@pytest.fixture
def queue() -> str:
    """A queue name of the test's own, so that tests sharing the database never meet."""
    return f"q{uuid.uuid4().hex[:10]}"
