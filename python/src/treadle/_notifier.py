"""LISTEN as a hint, on a connection of treadle's own: one notifier for the worker, `wait` and `watch`.

A notification says "look now"; it never says what changed. Whoever waits here
re-reads the database after every wake-up and on a timer as well, so a lost or
refused notification costs latency, never correctness. Where LISTEN is refused (a
standby) or the connection breaks, the wait turns into a plain sleep and the
timer carries on alone; a broken connection is opened again with backoff.

Behind a transaction-mode pooler (PgBouncer) notifications never arrive: point
the notifier at the server directly (`listen_dsn`), or do without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import Notify
from psycopg.rows import tuple_row

from . import _sql
from ._compat import read_extension_version
from ._retry import Backoff, one_line

if TYPE_CHECKING:
    from psycopg.abc import Query

# how often a wait on notifications looks at its stop event
_STOP_CHECK = 0.25


class Notifier:
    """An autocommit connection from `connect()`, running the LISTEN `statements`.

    `closing` runs before a listening connection is closed (treadle.unlisten_done
    after a treadle.listen_done among `statements`), and is skipped on a broken one.

    `open()` connects (errors propagate: a wrong DSN or a missing extension should
    be loud). After that, a broken connection is dropped and opened again on a
    later call, with backoff; meanwhile `receive` sleeps and `connection()`
    raises psycopg.OperationalError, which callers treat as "not known yet".
    Messages go to `log` (the worker's logger, or the client's).
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        statements: Sequence[Query],
        log: logging.Logger,
        *,
        trusted: bool = False,
        closing: Sequence[Query] = (),
    ) -> None:
        self.statements = tuple(statements)
        self._closing = tuple(closing)
        self._trusted = trusted  # a listen_dsn the user named: LISTEN there even through a proxy
        self.listening = False
        self.sessions = 0  # connections opened so far; a new one may have missed notifications
        self._connect_to_server = connect
        self._log = log
        self._conn: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0
        self._backoff = Backoff()

    def open(self) -> None:
        self._connect()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        listening, self.listening = self.listening, False
        if conn is not None:
            if listening and not conn.closed and not conn.broken:
                try:
                    for statement in self._closing:
                        conn.execute(statement)
                except psycopg.Error:
                    pass  # the next treadle.listen_done removes the rows of a session that ended
            conn.close()

    def connection(self) -> psycopg.Connection[Any]:
        """The live connection, opened again if it was lost (OperationalError if it cannot be)."""
        if self._conn is None or self._conn.closed:
            if time.monotonic() < self._retry_at:
                raise psycopg.OperationalError("treadle: waiting before connecting again")
            try:
                self._connect()
            except psycopg.OperationalError as error:
                delay = self._backoff.next()
                self._retry_at = time.monotonic() + delay
                self._log.info("LISTEN unavailable (%s); polling only, trying again in %.1f s", one_line(error), delay)
                raise
        assert self._conn is not None
        return self._conn

    def lost(self, error: BaseException) -> None:
        """Drop a connection that failed; the next call opens a new one."""
        self._log.warning("treadle: connection lost (%s); polling until it is back", one_line(error))
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
        conn = self._connect_to_server()
        try:
            read_extension_version(conn)
            self.listening = (
                bool(self.statements)
                and (self._trusted or is_direct(conn, self._log))
                and listen(conn, self.statements, self._log)
            )
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self.sessions += 1
        self._backoff.reset()


CANCEL_CHANNEL = "treadle_cancel"


class WakeOnNotify:
    """The worker's notifier thread: calls `wake()` when work becomes claimable on one of `queues`,
    and `on_cancel(payload)` when a cancel is requested of a running job (payload: its id)."""

    def __init__(
        self,
        notifier: Notifier,
        queues: Iterable[str],
        wake: Callable[[], None],
        name: str = "treadle-notifier",
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        self._notifier = notifier
        self._queues = frozenset(queues)
        self._wake = wake
        self._on_cancel = on_cancel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        sessions = 0
        try:
            while not self._stop.is_set():
                received = self._notifier.receive(_STOP_CHECK * 2, self._stop)
                if self._notifier.sessions != sessions:
                    sessions = self._notifier.sessions
                    self._wake()  # work may have arrived while nobody listened
                if self._on_cancel is not None:
                    for notify in received:
                        if notify.channel == CANCEL_CHANNEL:
                            self._on_cancel(notify.payload)
                if any(notify.payload in self._queues for notify in received if notify.channel != CANCEL_CHANNEL):
                    self._wake()
        finally:
            self._notifier.close()


def is_direct(conn: psycopg.Connection[Any], log: logging.Logger) -> bool:
    """Whether `conn` reaches the server itself, where a LISTEN stays with this session.

    Through a transaction-mode pooler, LISTEN lands on a server connection that is
    then handed to other clients, whose psycopg connections collect notifications
    nobody reads, while this one hears nothing. A pooler (or any proxy) shows
    itself by a port that is not the server's own.
    """
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(_sql.SERVER_PORT).fetchone()
    server_port = None if row is None else row[0]
    if server_port is None or conn.info.port == server_port:
        return True
    log.info(
        "treadle: port %s is not the server's own (%s): a pooler or proxy is in between, so no LISTEN "
        "through it; polling instead (pass listen_dsn, a direct connection, to LISTEN there)",
        conn.info.port,
        server_port,
    )
    return False


def listen(conn: psycopg.Connection[Any], statements: Sequence[Query], log: logging.Logger) -> bool:
    """Run LISTEN statements on an autocommit connection; False (and a warning) when refused."""
    try:
        for statement in statements:
            conn.execute(statement)
    except psycopg.OperationalError:
        raise
    except psycopg.Error as error:
        log.warning("treadle: LISTEN refused (%s); polling instead", one_line(error))
        return False
    return True


async def listen_async(conn: psycopg.AsyncConnection[Any], statements: Sequence[Query], log: logging.Logger) -> bool:
    """`listen` for an AsyncConnection."""
    try:
        for statement in statements:
            await conn.execute(statement)
    except psycopg.OperationalError:
        raise
    except psycopg.Error as error:
        log.warning("treadle: LISTEN refused (%s); polling instead", one_line(error))
        return False
    return True
