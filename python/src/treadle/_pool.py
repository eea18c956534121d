"""The worker's connections: a pool it owns or borrows, and a LISTEN connection of its own.

Statements run on pooled connections; a connection that died (server restart,
pg_terminate_backend) fails one statement, is dropped by the pool on its return,
and the caller retries on a fresh one (`_retry`).

Nothing here keeps session state a transaction-mode pooler (PgBouncer) would
break: every statement is a transaction of its own (autocommit), and prepared
statements are used only on a connection that reaches the server itself (`is_direct`:
a pooler answers with a backend process id of its own), unless the worker is told
otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool

from . import _sql
from ._dsn import Redactor, check
from ._literals import Fixed
from .errors import InvalidArgument

if TYPE_CHECKING:
    from typing_extensions import LiteralString

# how long a statement waits for a pooled connection before it counts as a transient failure
POOL_TIMEOUT = 10.0
# with prepared statements on, psycopg prepares a statement after it ran this many times on a connection
PREPARE_THRESHOLD = 2


class WorkerPool:
    """Runs the worker's statements on a pool, which it owns (from a DSN) or borrows."""

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool,
        application_name: str,
        max_size: int,
        *,
        prepared_statements: bool | None = None,
    ) -> None:
        self.application_name = application_name
        if isinstance(dsn_or_pool, ConnectionPool):
            self.pool = dsn_or_pool
            self.owns_pool = False
            # the LISTEN connection copies the pool's settings (psycopg_pool may hold them as callables)
            conninfo = dsn_or_pool.conninfo
            self.conninfo: str = conninfo() if callable(conninfo) else conninfo
        elif isinstance(dsn_or_pool, str):
            check(dsn_or_pool)  # read once: a string libpq cannot read stops the worker now, not every retry
            kwargs = {
                "autocommit": True,
                "application_name": application_name,
                "prepare_threshold": PREPARE_THRESHOLD if prepared_statements else None,
            }
            self.pool = ConnectionPool(
                dsn_or_pool,
                kwargs=kwargs,
                # undecided (None): each new connection prepares when it reaches the server itself
                configure=prepare_when_direct if prepared_statements is None else None,
                min_size=2,
                max_size=max(max_size, 2),
                open=False,
                timeout=POOL_TIMEOUT,
                name=application_name,
            )
            self.owns_pool = True
            self.conninfo = dsn_or_pool
        else:
            raise InvalidArgument(
                f"Worker needs a connection string or a psycopg_pool.ConnectionPool, not {type(dsn_or_pool).__name__}"
            )
        self.redactor = Redactor(self.conninfo)

    def open(self) -> None:
        self.redactor.install()  # the pool's retries log libpq's messages: never with the password
        if self.owns_pool:
            # do not wait: a server that is down now is retried by every statement
            self.pool.open(wait=False)

    def close(self) -> None:
        try:
            if self.owns_pool:
                self.pool.close(timeout=5.0)
        finally:
            self.redactor.remove()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; an open transaction commits when the block ends."""
        with self.pool.connection() as conn:
            yield conn

    def rows(self, query: LiteralString, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    def tuples(self, query: LiteralString | Fixed, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            if isinstance(query, Fixed):  # its fixed arguments written in where the connection prepares
                query, params = query.query(conn.prepare_threshold is not None, params or {}, conn)
            cur.execute(query, params)
            return cur.fetchall()

    def value(self, query: LiteralString, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row (the statements call one function)."""
        with self.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query, params)
            row = cur.fetchone()
            return None if row is None else row[0]


def is_direct(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn`'s session is a server process of its own, where prepared statements stay.

    libpq learns a process id when it connects (the cancel key); the server's own
    answers with its pg_backend_pid(). A pooler (PgBouncer in any mode, and the
    other poolers that multiplex sessions) answers with a key of its own, so the
    two differ; a plain TCP proxy passes the server's through, and its session is
    the server's. One query, on an autocommit connection: it leaves no transaction.
    """
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(_sql.BACKEND_PID, prepare=False).fetchone()
    return row is not None and row[0] == conn.info.backend_pid


def prepare_when_direct(conn: psycopg.Connection[Any]) -> None:
    """The pool's `configure`: let psycopg prepare repeated statements on a direct connection only."""
    conn.prepare_threshold = PREPARE_THRESHOLD if is_direct(conn) else None


def connect_direct(conninfo: str, application_name: str) -> psycopg.Connection[Any]:
    """A connection of its own (LISTEN needs one: a pooled one would be handed to others)."""
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=5, application_name=application_name)
