"""LISTEN as a hint, on a connection of treadle's own or one borrowed from the caller.

A notification says "look now"; it never says what changed. Whoever waits here
re-reads the database after every wake-up and on a timer as well, so a lost or
refused notification costs latency, never correctness. Where LISTEN is refused (a
pooler in transaction mode, a standby) or the connection breaks, the wait turns
into a plain sleep and the timer carries on alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import Notify

from . import _conn, _sql

if TYPE_CHECKING:
    from typing_extensions import LiteralString

log = logging.getLogger("treadle")

# reconnecting backs off from the first to the last delay, doubling
_RECONNECT_FIRST = 0.1
_RECONNECT_LAST = 5.0
# how often a wait on notifications looks at its stop event
_STOP_CHECK = 0.25


class Listener:
    """An autocommit connection opened from a DSN, running the LISTEN `statements`.

    `open()` connects (errors propagate: a wrong DSN or a missing extension should
    be loud). After that, a broken connection is dropped and opened again on a
    later call, with backoff; meanwhile `receive` sleeps and `connection()`
    raises psycopg.OperationalError, which callers treat as "not known yet".
    """

    def __init__(self, dsn: str, statements: Sequence[LiteralString]) -> None:
        self.dsn = dsn
        self.statements = tuple(statements)
        self.listening = False
        self.sessions = 0  # connections opened so far; a new one may have missed notifications
        self._conn: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0
        self._retry_delay = _RECONNECT_FIRST

    def open(self) -> None:
        self._connect()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self.listening = False
        if conn is not None:
            conn.close()

    def connection(self) -> psycopg.Connection[Any]:
        """The live connection, opened again if it was lost (OperationalError if it cannot be)."""
        if self._conn is None or self._conn.closed:
            if time.monotonic() < self._retry_at:
                raise psycopg.OperationalError("treadle: waiting before connecting again")
            try:
                self._connect()
            except psycopg.OperationalError:
                self._retry_at = time.monotonic() + self._retry_delay
                self._retry_delay = min(self._retry_delay * 2, _RECONNECT_LAST)
                raise
        assert self._conn is not None
        return self._conn

    def lost(self, error: BaseException) -> None:
        """Drop a connection that failed; the next call opens a new one."""
        log.warning("treadle: connection lost (%s); polling until it is back", error)
        self.close()

    def receive(self, seconds: float, stop: threading.Event | None = None) -> list[Notify]:
        """Notifications that arrive within `seconds` (returns at the first batch); [] on timeout.

        Without a listening connection it sleeps, trying to connect again now and
        then; it returns [] early when `stop` is set or a new connection was opened.
        """
        deadline = time.monotonic() + seconds
        sessions = self.sessions
        while (left := deadline - time.monotonic()) > 0 and not (stop is not None and stop.is_set()):
            slice_ = left if stop is None else min(left, _STOP_CHECK)
            if not self.listening and self.statements:
                try:
                    self.connection()
                except psycopg.OperationalError:
                    pass
                if self.sessions != sessions:
                    return []  # connected again: the caller may want to look at once
            if not self.listening:
                nap = slice_
                if self.statements and self._conn is None:  # lost: wake when the backoff allows a retry
                    nap = min(nap, max(self._retry_at - time.monotonic(), _STOP_CHECK / 10))
                if stop is None:
                    time.sleep(nap)
                else:
                    stop.wait(nap)
                continue
            assert self._conn is not None
            try:
                received = list(self._conn.notifies(timeout=slice_, stop_after=1))
            except psycopg.OperationalError as error:
                self.lost(error)
                continue
            if received:
                return received
        return []

    def _connect(self) -> None:
        conn = psycopg.connect(self.dsn, autocommit=True)
        try:
            _conn.ensure_extension(conn)
            self.listening = bool(self.statements) and listen(conn, self.statements)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self.sessions += 1
        self._retry_delay = _RECONNECT_FIRST


def listen(conn: psycopg.Connection[Any], statements: Sequence[LiteralString]) -> bool:
    """Run LISTEN statements on an autocommit connection; False (and a warning) when refused."""
    try:
        for statement in statements:
            conn.execute(statement)
    except psycopg.OperationalError:
        raise
    except psycopg.Error as error:
        log.warning("treadle: LISTEN refused (%s); polling instead", str(error).strip())
        return False
    return True


def can_borrow(conn: psycopg.Connection[Any]) -> bool:
    """Whether `wait` may LISTEN on the caller's connection and undo it afterwards.

    Only an autocommit connection outside a transaction that listens to nothing
    else: LISTEN there touches no transaction, and no notification of the caller's
    can be consumed by mistake.
    """
    if not conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    return not _conn.execute(conn, _sql.LISTENING_CHANNELS, {}, bool)


async def can_borrow_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """`can_borrow` for an AsyncConnection."""
    if not conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    return not await _conn.execute(conn, _sql.LISTENING_CHANNELS, {}, bool)


async def listen_async(conn: psycopg.AsyncConnection[Any], statements: Sequence[LiteralString]) -> bool:
    """`listen` for an AsyncConnection."""
    try:
        for statement in statements:
            await conn.execute(statement)
    except psycopg.OperationalError:
        raise
    except psycopg.Error as error:
        log.warning("treadle: LISTEN refused (%s); polling instead", str(error).strip())
        return False
    return True
