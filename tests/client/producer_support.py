"""Helpers for the producer-side tests (the fixtures using them are in conftest.py).

Jobs are moved on by `SqlWorker`, which does what a worker does with the
extension's own functions (claim, complete, fail) on a connection of its own, so
these tests need no Python worker. `backend_of` finds the backend of a connection
that `wait` or `watch` opened themselves, by the application_name put in its DSN.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

# how long a test waits for something that should happen at once; only a bound, so a
# broken behaviour fails instead of hanging (never a claim about speed)
PATIENCE = 60.0


class SqlWorker:
    """Claims and finishes jobs with treadle.claim / complete / fail, as a worker would."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

    def claim(self, job_id: int) -> UUID:
        found = self.conn.execute("SELECT queue, name FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
        assert found is not None, f"no job {job_id}"
        # claim picks by queue and name; tests give the jobs they finish names of their own
        row = self.conn.execute(
            "SELECT id, lease_token FROM treadle.claim('test-worker', ARRAY[%s], ARRAY[%s])", list(found)
        ).fetchone()
        assert row is not None and row[0] == job_id, f"claimed {row}, expected job {job_id}"
        return row[1]  # type: ignore[no-any-return]

    def complete(self, job_id: int, result: Any = None) -> None:
        token = self.claim(job_id)
        state = self.conn.execute(
            "SELECT treadle.complete(%s, %s, %s)", [job_id, token, None if result is None else Jsonb(result)]
        ).fetchone()
        assert state is not None and state[0] in ("completed", "cancelled")

    def fail(self, job_id: int, error: str) -> str:
        token = self.claim(job_id)
        state = self.conn.execute("SELECT treadle.fail(%s, %s, %s)", [job_id, token, error]).fetchone()
        assert state is not None
        return str(state[0])

    def cancel(self, job_id: int) -> None:
        assert self.conn.execute("SELECT treadle.cancel(%s)", [job_id]).fetchone() == (True,)

    def close(self) -> None:
        self.conn.close()


def transaction_status(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> TransactionStatus:
    """The connection's transaction status now: a call, so a type checker carries no earlier reading over."""
    return conn.info.transaction_status


def with_app_name(dsn: str, name: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


def backend_of(conn: psycopg.Connection[Any], app_name: str) -> int:
    """The pid of the one backend with that application_name, once it exists."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [app_name]).fetchall()
        if len(rows) == 1:
            return int(rows[0][0])
        time.sleep(0.02)
    raise AssertionError(f"no single backend named {app_name}")


def until_job_read(conn: psycopg.Connection[Any], pid: int) -> None:
    """Return once backend `pid` has read a job row and gone idle: `wait` is now pausing."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        row = conn.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        if (
            row is not None
            and row[0] in ("idle", "idle in transaction")
            and "FROM treadle.job_details WHERE id" in row[1]
        ):
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never read the job")


class Background:
    """A function run in a thread, whose result or exception the test collects."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as error:  # handed to the test by outcome()
            self.error = error

    def outcome(self) -> Any:
        self.thread.join(PATIENCE)
        assert not self.thread.is_alive(), "still running: it was never woken"
        if self.error is not None:
            raise self.error
        return self.result


def until_gone(conn: psycopg.Connection[Any], app_name: str) -> None:
    """Return once no backend has that application_name (a closed connection's backend exits soon after)."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name]).fetchone()
        if row == (0,):
            return
        time.sleep(0.02)
    raise AssertionError(f"a backend named {app_name} is still there")
