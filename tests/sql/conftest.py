"""Fixtures for the SQL layer's multi-connection tests.

`connect` opens as many real connections to the test's database as a test needs
(closing them all afterwards); `wait_until_blocked` watches pg_stat_activity until a
session waits on a lock, so a test can order two transactions without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.sql.sqlcalls import Connect, WaitBlocked


@pytest.fixture
def connect(dsn: str) -> Iterator[Connect]:
    """connect(autocommit=True) -> a new connection to the test's database."""
    opened: list[psycopg.Connection] = []

    def open_connection(autocommit: bool = True) -> psycopg.Connection:
        conn = psycopg.connect(dsn, autocommit=autocommit)
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        conn.close()


@pytest.fixture
def wait_until_blocked(dsn: str) -> Iterator[WaitBlocked]:
    """wait_until_blocked(pid): return once backend pid waits for a lock (fail after 60 s)."""
    with psycopg.connect(dsn, autocommit=True) as watcher:

        def wait(pid: int) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = watcher.execute("select wait_event_type from pg_stat_activity where pid = %s", (pid,)).fetchone()
                if row is not None and row[0] == "Lock":
                    return
                time.sleep(0.01)
            raise AssertionError(f"backend {pid} never waited for a lock")

        yield wait
