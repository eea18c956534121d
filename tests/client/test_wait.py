"""wait: the result of a finished job, or how it ended; woken by LISTEN, polling anyway.

A test that shows LISTEN woke the waiter sets poll_interval to an hour: only a
notification can end that wait while the test is still there to see it. Jobs
are finished only after the waiter has read the job once (`until_job_read`), so
the waiter cannot simply find the job already finished.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

import treadle
from tests.client.producer_support import (
    PATIENCE,
    Background,
    SqlWorker,
    backend_of,
    transaction_status,
    until_gone,
    until_job_read,
    with_app_name,
)
from treadle import _sql

HOUR = 3600.0


def test_dsn_wait_is_woken_by_listen(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    job_id = treadle.enqueue(conn, "add", {"a": 1, "b": 2}, queue="math")
    waiter = Background(lambda: treadle.wait(with_app_name(dsn, "waiter"), job_id, poll_interval=HOUR))
    until_job_read(conn, backend_of(conn, "waiter"))
    assert conn.execute("SELECT queue FROM treadle.done_waiters").fetchall() == [("math",)]  # it waits on the queue
    sql_worker.complete(job_id, {"sum": 3})
    assert waiter.outcome() == {"sum": 3}
    until_gone(conn, "waiter")  # the waiter closed its own connection
    assert conn.execute("SELECT count(*) FROM treadle.done_waiters").fetchone() == (0,)  # unregistered first


def test_dsn_wait_polls_without_listen(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    job_id = treadle.enqueue(conn, "x")
    waiter = Background(lambda: treadle.wait(with_app_name(dsn, "poller"), job_id, listen=False, poll_interval=0.05))
    pid = backend_of(conn, "poller")
    until_job_read(conn, pid)
    assert conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
    sql_worker.complete(job_id, [1, "two"])
    assert waiter.outcome() == [1, "two"]


def test_finished_jobs_answer_at_once(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    done = treadle.enqueue(conn, "x")
    sql_worker.complete(done)  # a handler that returned None
    assert treadle.wait(conn, done, timeout=0) is None
    failed = treadle.enqueue(conn, "y", max_attempts=1)
    assert sql_worker.fail(failed, "boom: out of paper") == "discarded"
    with pytest.raises(treadle.JobFailed) as job_failed:
        treadle.wait(conn, failed, timeout=0)
    assert (job_failed.value.job_id, job_failed.value.error) == (failed, "boom: out of paper")
    assert "boom: out of paper" in str(job_failed.value)
    cancelled = treadle.enqueue(conn, "z")
    treadle.cancel(conn, cancelled)
    with pytest.raises(treadle.JobCancelled) as job_cancelled:
        treadle.wait(conn, cancelled, timeout=0)
    assert job_cancelled.value.job_id == cancelled


def test_a_retryable_failure_keeps_waiting(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    job_id = treadle.enqueue(conn, "flaky", max_attempts=2)
    assert sql_worker.fail(job_id, "first try") == "retryable"
    with pytest.raises(treadle.WaitTimeout):
        treadle.wait(dsn, job_id, timeout=0.2, poll_interval=0.05)
    # move the worker's clock past the retry backoff
    sql_worker.conn.execute("SELECT set_config('treadle.now', (now() + interval '1 hour')::text, false)")
    assert sql_worker.fail(job_id, "second try") == "discarded"
    with pytest.raises(treadle.JobFailed, match="second try"):
        treadle.wait(dsn, job_id, timeout=0)


def test_failure_and_cancel_while_waiting(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    failing = treadle.enqueue(conn, "f", max_attempts=1)
    waiter = Background(lambda: treadle.wait(with_app_name(dsn, "w1"), failing, poll_interval=HOUR))
    until_job_read(conn, backend_of(conn, "w1"))
    sql_worker.fail(failing, "disk full")
    with pytest.raises(treadle.JobFailed, match="disk full"):
        waiter.outcome()

    cancelled = treadle.enqueue(conn, "c")
    waiter = Background(lambda: treadle.wait(with_app_name(dsn, "w2"), cancelled, poll_interval=HOUR))
    until_job_read(conn, backend_of(conn, "w2"))
    sql_worker.cancel(cancelled)
    with pytest.raises(treadle.JobCancelled):
        waiter.outcome()


def test_timeout_leaves_the_job_alone(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    job_id = treadle.enqueue(conn, "slow")
    with pytest.raises(treadle.WaitTimeout) as timed_out:
        treadle.wait(dsn, job_id, timeout=0.2, poll_interval=0.05)
    assert (timed_out.value.job_id, timed_out.value.timeout) == (job_id, 0.2)
    assert isinstance(timed_out.value, TimeoutError)
    with pytest.raises(treadle.WaitTimeout):
        treadle.wait(conn, job_id, timeout=0)
    job = treadle.get_job(conn, job_id)
    assert job is not None and (job.state, job.attempt, job.cancel_requested) == ("available", 0, False)
    # waiting again later picks the same job up
    sql_worker.complete(job_id, {"late": True})
    assert treadle.wait(dsn, job_id, timeout=PATIENCE) == {"late": True}


def test_unknown_job(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(treadle.JobNotFound) as not_found:
        treadle.wait(dsn, 424242, timeout=PATIENCE)
    assert not_found.value.job_id == 424242 and isinstance(not_found.value, LookupError)
    with pytest.raises(treadle.JobNotFound):
        treadle.wait(conn, 424242)


def test_borrows_an_idle_autocommit_connection_for_listen(
    conn: psycopg.Connection[Any], dsn: str, sql_worker: SqlWorker
) -> None:
    job_id = treadle.enqueue(conn, "x", queue="q1")
    with psycopg.connect(dsn, autocommit=True) as caller:
        pid = caller.info.backend_pid
        waiter = Background(lambda: treadle.wait(caller, job_id, poll_interval=HOUR))
        until_job_read(conn, pid)
        # a job finishing on another queue is not this one: the waiter keeps waiting
        other = treadle.enqueue(conn, "y", queue="q2")
        sql_worker.complete(other)
        sql_worker.complete(job_id, "done")
        assert waiter.outcome() == "done"
        # LISTEN was undone, and no stale hint is left for the caller
        assert caller.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        assert list(caller.notifies(timeout=0)) == []
        # nor a registration: finishes on q1 notify nobody again
        assert conn.execute("SELECT count(*) FROM treadle.done_waiters").fetchone() == (0,)


def test_a_connection_listening_to_its_own_channels_is_only_polled(
    conn: psycopg.Connection[Any], dsn: str, sql_worker: SqlWorker
) -> None:
    job_id = treadle.enqueue(conn, "x")
    with psycopg.connect(dsn, autocommit=True) as caller:
        caller.execute("LISTEN mine")
        waiter = Background(lambda: treadle.wait(caller, job_id, poll_interval=0.05))
        until_job_read(conn, caller.info.backend_pid)
        conn.execute("NOTIFY mine, 'for the caller'")
        sql_worker.complete(job_id, 7)
        assert waiter.outcome() == 7
        assert caller.execute("SELECT pg_listening_channels()").fetchall() == [("mine",)]
        # the caller's notification was not consumed by the wait
        assert [n.payload for n in caller.notifies(timeout=PATIENCE, stop_after=1)] == ["for the caller"]


def test_inside_the_callers_transaction_it_polls_and_leaves_it_open(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    job_id = treadle.enqueue(conn, "x")
    with psycopg.connect(dsn) as caller:
        caller.execute("CREATE TABLE mine (v int)")
        caller.execute("INSERT INTO mine VALUES (1)")
        waiter = Background(lambda: treadle.wait(caller, job_id, poll_interval=0.05))
        until_job_read(conn, caller.info.backend_pid)
        sql_worker.complete(job_id, {"seen": "in a read committed transaction"})
        assert waiter.outcome() == {"seen": "in a read committed transaction"}
        assert caller.info.transaction_status == TransactionStatus.INTRANS
        assert caller.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        caller.commit()
    assert conn.execute("SELECT count(*) FROM mine").fetchone() == (1,)


def test_a_non_autocommit_idle_connection_is_left_idle(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    job_id = treadle.enqueue(conn, "x")
    with psycopg.connect(dsn) as caller:
        with pytest.raises(treadle.WaitTimeout):
            treadle.wait(caller, job_id, timeout=0.1, poll_interval=0.05)
        assert caller.info.transaction_status == TransactionStatus.IDLE
        sql_worker.complete(job_id, 1)
        assert treadle.wait(caller, job_id, poll_interval=0.05) == 1
        assert caller.info.transaction_status == TransactionStatus.IDLE


def test_a_repeatable_read_transaction_is_refused(dsn: str, conn: psycopg.Connection[Any]) -> None:
    job_id = treadle.enqueue(conn, "x")
    with psycopg.connect(dsn) as caller:
        caller.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        caller.execute("SELECT 1")
        with pytest.raises(treadle.InvalidArgument, match="repeatable read"):
            treadle.wait(caller, job_id, timeout=PATIENCE)
        assert caller.info.transaction_status == TransactionStatus.INTRANS


def test_async_wait_borrows_listen(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    job_id = treadle.enqueue(conn, "x")

    async def scenario() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            waiting = asyncio.ensure_future(treadle.wait(aconn, job_id, poll_interval=HOUR))

            def finish() -> None:
                until_job_read(conn, aconn.info.backend_pid)
                sql_worker.complete(job_id, {"async": True})

            await asyncio.to_thread(finish)
            result = await asyncio.wait_for(waiting, PATIENCE)
            listening = await (await aconn.execute("SELECT count(*) FROM pg_listening_channels()")).fetchone()
            return result, listening

    assert asyncio.run(scenario()) == ({"async": True}, (0,))


def test_async_wait_in_a_transaction_and_outcomes(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    job_id = treadle.enqueue(conn, "x")
    failed = treadle.enqueue(conn, "y", max_attempts=1)
    sql_worker.fail(failed, "nope")

    async def scenario() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with pytest.raises(treadle.JobFailed, match="nope"):
                await treadle.wait(aconn, failed)
            assert aconn.info.transaction_status == TransactionStatus.IDLE  # its read was rolled back
            await aconn.execute("SELECT 1")  # now inside a transaction: polls
            waiting = asyncio.ensure_future(treadle.wait(aconn, job_id, poll_interval=0.05))

            def finish() -> None:
                until_job_read(conn, aconn.info.backend_pid)
                sql_worker.complete(job_id, 5)

            await asyncio.to_thread(finish)
            result = await asyncio.wait_for(waiting, PATIENCE)
            assert transaction_status(aconn) == TransactionStatus.INTRANS
            with pytest.raises(treadle.WaitTimeout):
                await treadle.wait(aconn, treadle.enqueue(conn, "z"), timeout=0.1, poll_interval=0.05)
            return result

    assert asyncio.run(scenario()) == 5


def test_a_refused_listen_falls_back_to_polling(
    dsn: str,
    conn: psycopg.Connection[Any],
    sql_worker: SqlWorker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a statement the server refuses stands in for a pooler that refuses LISTEN
    monkeypatch.setattr(_sql, "LISTEN_DONE", "LISTEN")
    job_id = treadle.enqueue(conn, "x")
    with caplog.at_level(logging.WARNING, logger="treadle"):
        waiter = Background(lambda: treadle.wait(with_app_name(dsn, "refused"), job_id, poll_interval=0.05))
        until_job_read(conn, backend_of(conn, "refused"))
        sql_worker.complete(job_id, "polled")
        assert waiter.outcome() == "polled"

        other = treadle.enqueue(conn, "y")
        with psycopg.connect(dsn, autocommit=True) as caller:
            waiter = Background(lambda: treadle.wait(caller, other, poll_interval=0.05))
            until_job_read(conn, caller.info.backend_pid)
            sql_worker.complete(other, "polled too")
            assert waiter.outcome() == "polled too"
            assert caller.info.transaction_status == TransactionStatus.IDLE
    assert sum("LISTEN refused" in record.getMessage() for record in caplog.records) == 2


def test_dsn_wait_survives_losing_its_connection(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = treadle.enqueue(conn, "x")
    with caplog.at_level(logging.WARNING, logger="treadle"):
        waiter = Background(lambda: treadle.wait(with_app_name(dsn, "doomed"), job_id, poll_interval=0.05))
        pid = backend_of(conn, "doomed")
        until_job_read(conn, pid)
        assert conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
        sql_worker.complete(job_id, "after the outage")
        assert waiter.outcome() == "after the outage"
    assert any("connection lost" in record.getMessage() for record in caplog.records)


@pytest.mark.extension_only  # drops or replaces the extension
def test_a_database_without_the_extension(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP EXTENSION treadle")
    with pytest.raises(treadle.ExtensionMissing):
        treadle.wait(dsn, 1, timeout=PATIENCE)
    with pytest.raises(treadle.ExtensionMissing):
        treadle.wait(conn, 1, timeout=PATIENCE)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"job_id": "1"}, "job_id must be an integer"),
        ({"timeout": -1}, "timeout must be at least 0"),
        ({"timeout": float("nan")}, "timeout must be a finite number"),
        ({"timeout": "5"}, "timeout must be a number of seconds or a timedelta"),
        ({"poll_interval": 0}, "poll_interval must be positive"),
        ({"listen": "yes"}, "listen must be True or False"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    call: dict[str, Any] = {"job_id": 1, **kwargs}
    with pytest.raises(treadle.InvalidArgument, match=message):
        treadle.wait("postgresql://refused-before-connecting/", **call)


def test_not_a_connection() -> None:
    with pytest.raises(TypeError, match="psycopg Connection or AsyncConnection"):
        treadle.wait(42, 1)  # type: ignore[call-overload]


def test_a_dsn_that_cannot_connect_is_an_error_at_once() -> None:
    with pytest.raises(psycopg.OperationalError):
        treadle.wait("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=5", 1, timeout=PATIENCE)


def test_waits_that_start_as_their_jobs_finish_all_end_without_polling(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Finishes notify only registered waiters: each wait registers, LISTENs, then reads.

    Rounds of 24 waits start while 4 finishers complete the same jobs in one commit
    each, at one instant, later each round (0 to 0.8 s), so registrations fall before,
    amid and after the finishes. The poll is an hour: a finish that neither notified a
    wait nor was seen by its read would leave that wait hanging to its timeout.
    """
    queues = ["race-a", "race-b", "race-c"]
    finishers = [psycopg.connect(dsn, autocommit=True) for _ in range(4)]
    try:
        for delay in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8):
            jobs = [treadle.enqueue(conn, "race", queue=queues[n % 3]) for n in range(24)]
            held = conn.execute(
                "SELECT id, lease_token FROM treadle.claim('racer', %s, batch => 24)", (queues,)
            ).fetchall()
            assert sorted(job_id for job_id, _ in held) == sorted(jobs)
            start = threading.Barrier(len(finishers) + 1)

            def finish(
                finisher: psycopg.Connection[Any], share: list[tuple[int, Any]], start: threading.Barrier
            ) -> None:
                start.wait(PATIENCE)
                finisher.execute("SELECT treadle.complete_many(%s, %s)", ([j for j, _ in share], [t for _, t in share]))

            def waited(job_id: int) -> float:
                began = time.monotonic()
                assert treadle.wait(dsn, job_id, poll_interval=HOUR, timeout=30) is None
                return time.monotonic() - began  # 30 s and more: it ended at its timeout, not woken

            with ThreadPoolExecutor(len(jobs) + len(finishers)) as pool:
                waits = [pool.submit(waited, job_id) for job_id in jobs]
                done = [pool.submit(finish, f, held[n :: len(finishers)], start) for n, f in enumerate(finishers)]
                time.sleep(delay)
                start.wait(PATIENCE)
                for future in done:
                    future.result(PATIENCE)
                assert max(future.result(PATIENCE) for future in waits) < 15
    finally:
        for finisher in finishers:
            finisher.close()
