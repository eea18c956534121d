"""The worker's connections: a pool it owns or borrows, and dedicated LISTEN connections.

Statements run on pooled connections; a connection that died (server restart,
pg_terminate_backend) fails one statement, is dropped by the pool on its return,
and the caller retries on a fresh one (`is_transient`, `Backoff`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool

from treadle import _sql
from treadle._conn import check_version
from treadle.errors import InvalidArgument

# how long a statement waits for a pooled connection before it counts as a transient failure
POOL_TIMEOUT = 10.0
# psycopg prepares a statement after it ran this many times on a connection
PREPARE_THRESHOLD = 2


def is_transient(error: BaseException) -> bool:
    """True for errors that retrying on a fresh connection can cure.

    OperationalError covers a lost or refused connection, an administrator's
    termination, a pool that timed out, serialization failures and deadlocks.
    """
    return isinstance(error, psycopg.OperationalError)


class Backoff:
    """Delays between retries of a failing operation: 0.1 s doubling up to a cap."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self._first = first
        self._cap = cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self._cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self._first


class Database:
    """Runs the worker's statements on a pool, which it owns (from a DSN) or borrows."""

    def __init__(self, dsn_or_pool: str | ConnectionPool, application_name: str, max_size: int) -> None:
        if isinstance(dsn_or_pool, ConnectionPool):
            self.pool = dsn_or_pool
            self.owns_pool = False
            # the LISTEN connection copies the pool's settings (psycopg_pool may hold them as callables)
            conninfo, kwargs = dsn_or_pool.conninfo, dsn_or_pool.kwargs
            self._conninfo: str = conninfo() if callable(conninfo) else conninfo
            self._listen_kwargs: dict[str, Any] = dict((kwargs() if callable(kwargs) else kwargs) or {})
        elif isinstance(dsn_or_pool, str):
            if not dsn_or_pool.strip():
                raise InvalidArgument("the connection string must not be empty")
            kwargs = {
                "autocommit": True,
                "application_name": application_name,
                "prepare_threshold": PREPARE_THRESHOLD,
            }
            self.pool = ConnectionPool(
                dsn_or_pool, kwargs=kwargs, min_size=2, max_size=max(max_size, 2), open=False,
                timeout=POOL_TIMEOUT, name=application_name,
            )
            self.owns_pool = True
            self._conninfo = dsn_or_pool
            self._listen_kwargs = {"application_name": application_name}
        else:
            raise InvalidArgument(
                f"Worker needs a connection string or a psycopg_pool.ConnectionPool, not {type(dsn_or_pool).__name__}"
            )

    def open(self) -> None:
        if self.owns_pool:
            # do not wait: a server that is down now is retried by every statement
            self.pool.open(wait=False)

    def close(self) -> None:
        if self.owns_pool:
            self.pool.close(timeout=5.0)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; an open transaction commits when the block ends."""
        with self.pool.connection() as conn:
            yield conn

    def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    def value(self, query: str, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row (the statements call one function)."""
        with self.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query, params)
            row = cur.fetchone()
            return None if row is None else row[0]

    def listen_connection(self) -> psycopg.Connection[Any]:
        """A connection of its own for LISTEN (a pooled one would be handed to others)."""
        kwargs = {**self._listen_kwargs, "autocommit": True, "connect_timeout": 5}
        return psycopg.connect(self._conninfo, **kwargs)


def check_extension(conn: psycopg.Connection[Any]) -> None:
    """Raise ExtensionMissing or UnsupportedVersion unless the database has a treadle this package speaks."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_sql.EXTENSION_VERSION)
        row = cur.fetchone()
    check_version(None if row is None else row[0], conn.info.dbname)


def one_line(error: BaseException) -> str:
    """An exception as one log-friendly line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
