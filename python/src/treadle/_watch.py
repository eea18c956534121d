"""`watch`: signals that jobs on some queues may have changed.

This is polling that LISTEN makes prompt, not an event log. A signal means
"re-read now", and the database is where the answer is: ("queued", queue) comes
from treadle_jobs (work became claimable), ("done", queue) from treadle_done (jobs
finished), and ("poll", None) from a timer that runs whether or not LISTEN works,
so a consumer that re-reads on every signal is correct even where LISTEN is
refused or a connection breaks, only slower there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Literal, NamedTuple

import psycopg
from psycopg import Notify, sql

from . import _sql
from ._notifier import Notifier

if TYPE_CHECKING:
    from psycopg.abc import Query

log = logging.getLogger("treadle")

_KINDS = {_sql.CHANNEL_JOBS: "queued", _sql.CHANNEL_DONE: "done"}


class WatchEvent(NamedTuple):
    """One signal from `watch`: ("queued", queue), ("done", queue) or ("poll", None)."""

    kind: Literal["queued", "done", "poll"]
    queue: str | None


POLL = WatchEvent("poll", None)


def events(
    dsn: str,
    queues: frozenset[str] | None,
    poll_interval: float,
    listen: bool,
    stop: threading.Event | None,
    listen_dsn: str | None = None,
) -> Generator[WatchEvent, None, None]:
    """The signals, until `stop` is set (or the consumer stops iterating).

    LISTEN runs on `listen_dsn` when given (a direct connection beside a pooler),
    else on `dsn` when that reaches the server directly. The first signal is a
    poll sent once listening has begun, so a consumer that reads on every signal
    cannot miss a change made before it started; another follows each
    reconnection, for the notifications the outage swallowed.
    """
    target = dsn if listen_dsn is None else listen_dsn
    # finishes notify only sessions that wait on their queues: register before LISTEN
    register: Query = (
        _sql.WAIT_FOR_ALL if queues is None else sql.SQL(_sql.WAIT_FOR_QUEUES).format(sql.Literal(sorted(queues)))
    )
    listener = Notifier(
        lambda: psycopg.connect(target, autocommit=True),
        [register, _sql.LISTEN_JOBS, _sql.LISTEN_DONE] if listen else [],
        log,
        trusted=listen_dsn is not None,
        closing=[_sql.STOP_WAITING],
    )
    listener.open()  # a wrong DSN or a missing extension is raised here, not hidden
    if not listen:
        listener.close()  # the timer needs no connection; opening one checked the extension
    try:
        sessions = listener.sessions
        yield POLL
        next_tick = time.monotonic() + poll_interval
        while stop is None or not stop.is_set():
            left = next_tick - time.monotonic()
            if left <= 0 or listener.sessions != sessions:
                sessions = listener.sessions
                next_tick = time.monotonic() + poll_interval
                yield POLL
                continue
            for notify in listener.receive(left, stop):
                event = _event(notify, queues)
                if event is not None:
                    yield event
    finally:
        listener.close()


def _event(notify: Notify, queues: frozenset[str] | None) -> WatchEvent | None:
    kind = _KINDS.get(notify.channel)
    if kind is None or (queues is not None and notify.payload not in queues):
        return None
    return WatchEvent(kind, notify.payload)  # type: ignore[arg-type]
