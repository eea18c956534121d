"""Throwaway databases on the test server, for tests that install treadle their own way."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


def with_db(url: str, dbname: str) -> str:
    """The same server URL, naming another database."""
    return url.rsplit("/", 1)[0] + "/" + dbname


@contextmanager
def scratch_database(server: str, hint: str, owner: str | None = None) -> Iterator[str]:
    """An empty database (from template0, so without treadle), dropped on exit; yields its URL."""
    name = f"treadle_{hint}_{uuid.uuid4().hex[:8]}"
    owned = f' OWNER "{owner}"' if owner else ""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0{owned}')
    try:
        yield with_db(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
