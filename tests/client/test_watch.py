"""watch: ("queued", q) and ("done", q) from LISTEN, ("poll", None) from a timer that always runs.

Tests that show an event came from LISTEN set poll_interval to an hour, so no
timer tick can stand in for it. A `Watcher` runs watch in a thread (as a
callback loop or as an iterator) and hands its events over through a queue.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import treadle
from tests.client.producer_support import PATIENCE, Background, SqlWorker, backend_of, until_gone, with_app_name
from treadle import WatchEvent, _sql

HOUR = 3600.0
POLL = ("poll", None)


class Watcher:
    def __init__(self, dsn: str, queues: list[str] | None, *, iterator: bool = False, **options: Any) -> None:
        self.events: queue.Queue[WatchEvent] = queue.Queue()
        self.stop = threading.Event()
        if iterator:

            def run() -> None:
                for event in treadle.watch(dsn, queues, stop=self.stop, **options):
                    self.events.put(event)
        else:

            def run() -> None:
                treadle.watch(dsn, queues, self.events.put, stop=self.stop, **options)

        self.runner = Background(run)

    def next(self) -> WatchEvent:
        return self.events.get(timeout=PATIENCE)

    def close(self) -> None:
        self.stop.set()
        self.runner.outcome()


@pytest.fixture
def watchers() -> Iterator[list[Watcher]]:
    started: list[Watcher] = []
    yield started
    for watcher in started:
        watcher.stop.set()


@pytest.mark.parametrize("iterator", [False, True], ids=["callback", "iterator"])
def test_queued_and_done_events_for_the_watched_queues(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker, watchers: list[Watcher], iterator: bool
) -> None:
    watcher = Watcher(with_app_name(dsn, "watcher"), ["mail", "sms"], iterator=iterator, poll_interval=HOUR)
    watchers.append(watcher)
    assert watcher.next() == POLL  # listening has begun: read now
    # registered for finishes on its queues, so that finishing there notifies
    assert conn.execute("SELECT queue FROM treadle.done_waiters ORDER BY queue").fetchall() == [("mail",), ("sms",)]
    job_id = treadle.enqueue(conn, "send", queue="mail")
    assert watcher.next() == ("queued", "mail")
    treadle.enqueue(conn, "resize", queue="images")  # not watched
    sql_worker.complete(job_id, {"sent": True})
    event = watcher.next()
    assert (event.kind, event.queue) == ("done", "mail") and event == ("done", "mail")
    treadle.start_workflow(conn, "notify", steps=["a"], queue="sms")
    assert watcher.next() == ("queued", "sms")
    watcher.close()
    assert watcher.events.empty()
    until_gone(conn, "watcher")
    assert conn.execute("SELECT count(*) FROM treadle.done_waiters").fetchone() == (0,)  # and no longer


def test_every_queue_when_queues_is_none(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker, watchers: list[Watcher]
) -> None:
    watcher = Watcher(dsn, None, poll_interval=HOUR)
    watchers.append(watcher)
    assert watcher.next() == POLL
    treadle.enqueue_many(conn, [{"name": "a", "queue": "one"}])
    treadle.cancel(conn, treadle.enqueue(conn, "b", queue="two"))
    assert [watcher.next() for _ in range(3)] == [("queued", "one"), ("queued", "two"), ("done", "two")]
    watcher.close()


def test_the_timer_ticks_without_listen(dsn: str, conn: psycopg.Connection[Any], watchers: list[Watcher]) -> None:
    watcher = Watcher(with_app_name(dsn, "timer"), ["default"], listen=False, poll_interval=0.05)
    watchers.append(watcher)
    assert watcher.next() == POLL
    until_gone(conn, "timer")  # the extension was checked; the timer needs no connection
    treadle.enqueue(conn, "x")
    assert [watcher.next() for _ in range(5)] == [POLL] * 5
    watcher.close()


def test_the_timer_ticks_alongside_listen(dsn: str, conn: psycopg.Connection[Any], watchers: list[Watcher]) -> None:
    watcher = Watcher(dsn, ["default"], poll_interval=0.05)
    watchers.append(watcher)
    assert [watcher.next() for _ in range(3)] == [POLL] * 3
    watcher.close()


def test_a_refused_listen_leaves_the_timer(
    dsn: str,
    conn: psycopg.Connection[Any],
    watchers: list[Watcher],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_sql, "LISTEN_JOBS", "LISTEN")  # the server refuses it, as a pooler might
    with caplog.at_level(logging.WARNING, logger="treadle"):
        watcher = Watcher(dsn, ["default"], poll_interval=0.05)
        watchers.append(watcher)
        assert watcher.next() == POLL
        treadle.enqueue(conn, "x")
        assert [watcher.next() for _ in range(5)] == [POLL] * 5
        watcher.close()
    assert any("LISTEN refused" in record.getMessage() for record in caplog.records)


def test_reconnects_after_losing_its_connection(
    dsn: str, conn: psycopg.Connection[Any], watchers: list[Watcher], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="treadle"):
        watcher = Watcher(with_app_name(dsn, "fragile"), ["default"], poll_interval=HOUR)
        watchers.append(watcher)
        assert watcher.next() == POLL
        first = backend_of(conn, "fragile")
        assert conn.execute("SELECT pg_terminate_backend(%s)", [first]).fetchone() == (True,)
        # a poll after reconnecting covers what the outage may have hidden
        assert watcher.next() == POLL
        assert backend_of(conn, "fragile") != first
        treadle.enqueue(conn, "x")
        assert watcher.next() == ("queued", "default")
        watcher.close()
    assert any("connection lost" in record.getMessage() for record in caplog.records)


def test_closing_the_iterator_closes_the_connection(dsn: str, conn: psycopg.Connection[Any]) -> None:
    events = treadle.watch(with_app_name(dsn, "closing"), ["default"], poll_interval=HOUR)
    assert next(events) == POLL
    backend_of(conn, "closing")
    events.close()
    until_gone(conn, "closing")


@pytest.mark.extension_only  # drops or replaces the extension
def test_a_database_without_the_extension(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP EXTENSION treadle")
    with pytest.raises(treadle.ExtensionMissing):
        next(treadle.watch(dsn, ["default"]))
    with pytest.raises(treadle.ExtensionMissing):
        treadle.watch(dsn, ["default"], print, listen=False)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((42, ["q"]), {}, "dsn must be a connection string"),
        (("dsn", "mail"), {}, "queues must be a list of names, not str"),
        (("dsn", []), {}, "queues must be None"),
        (("dsn", ["mail", " "]), {}, "queues must be None"),
        (("dsn", ["mail", 3]), {}, r"queues\[1\] must be a string"),
        (("dsn", ["q"]), {"poll_interval": 0}, "poll_interval must be positive"),
        (("dsn", ["q"]), {"poll_interval": -1.5}, "poll_interval must be positive"),
        (("dsn", ["q"]), {"listen": 1}, "listen must be True or False"),
        (("dsn", ["q"]), {"stop": True}, "stop must be a threading.Event"),
        (("dsn", ["q"], "not callable"), {}, "callback must be callable"),
    ],
)
def test_bad_arguments(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(treadle.InvalidArgument, match=message):
        treadle.watch(*args, **kwargs)


def test_a_dsn_that_cannot_connect_is_an_error_at_once() -> None:
    with pytest.raises(psycopg.OperationalError):
        next(treadle.watch("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=5", ["default"]))
