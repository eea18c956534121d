"""wait_workflow: a finished run's results, or how it ended; woken by LISTEN, polling anyway.

Steps are moved on with the extension's own functions (`SqlWorker`: claim, then
complete or fail), as a worker would. A test that shows LISTEN woke the waiter
sets poll_interval to an hour: only a notification can end that wait while the
test is still there to see it. Steps are finished only after the waiter has read
the run once (`until_run_read`), so the waiter cannot simply find it finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

import treadle
from tests.client.producer_support import (
    PATIENCE,
    Background,
    SqlWorker,
    backend_of,
    transaction_status,
    until_gone,
    with_app_name,
)
from treadle import _sql

HOUR = 3600.0
STEPS = ["reserve", "charge", "ship"]
RESULTS = {"reserve": {"held": 3}, "charge": {"paid": 99.5}, "ship": {"parcel": "P-1"}}


def start(conn: psycopg.Connection[Any], name: str = "order", **options: Any) -> int:
    return treadle.start_workflow(conn, name, {"order": 7}, steps=STEPS, queue="shop", **options)


def pending_step(conn: psycopg.Connection[Any], run_id: int) -> int:
    """The id of the run's step job that waits to be claimed."""
    row = conn.execute(
        "SELECT id FROM treadle.jobs WHERE workflow_run_id = %s AND state = 'available'", [run_id]
    ).fetchone()
    assert row is not None, f"run {run_id} has no step waiting"
    return int(row[0])


def finish_step(sql_worker: SqlWorker, run_id: int, result: Any) -> None:
    sql_worker.complete(pending_step(sql_worker.conn, run_id), result)


def finish_run(sql_worker: SqlWorker, run_id: int) -> None:
    for step in STEPS:
        finish_step(sql_worker, run_id, RESULTS[step])


def until_run_read(conn: psycopg.Connection[Any], pid: int) -> None:
    """Return once backend `pid` has read a run and gone idle: `wait_workflow` is now pausing."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        row = conn.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        if row is not None and row[0] in ("idle", "idle in transaction") and "FROM treadle.workflow_runs" in row[1]:
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never read the run")


def run_row(conn: psycopg.Connection[Any], run_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT state, results, finished_at FROM treadle.workflow_runs WHERE id = %s", [run_id]
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_dsn_wait_is_woken_by_listen_and_returns_every_steps_result(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(conn)
    waiter = Background(lambda: treadle.wait_workflow(with_app_name(dsn, "run-waiter"), run_id, poll_interval=HOUR))
    until_run_read(conn, backend_of(conn, "run-waiter"))
    finish_run(sql_worker, run_id)
    assert waiter.outcome() == RESULTS
    assert treadle.workflow_results(conn, run_id) == RESULTS
    until_gone(conn, "run-waiter")  # the waiter closed its own connection


def test_dsn_wait_polls_without_listen(
    dsn: str,
    conn: psycopg.Connection[Any],
    sql_worker: SqlWorker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a LISTEN the server refuses would log a warning: none is logged, so none was sent
    monkeypatch.setattr(_sql, "LISTEN_DONE", "LISTEN")
    run_id = start(conn)
    with caplog.at_level(logging.WARNING, logger="treadle"):
        waiter = Background(
            lambda: treadle.wait_workflow(with_app_name(dsn, "run-poller"), run_id, listen=False, poll_interval=0.05)
        )
        until_run_read(conn, backend_of(conn, "run-poller"))
        finish_run(sql_worker, run_id)
        assert waiter.outcome() == RESULTS
    assert not [record for record in caplog.records if "LISTEN" in record.getMessage()]


def test_a_refused_listen_falls_back_to_polling(
    dsn: str,
    conn: psycopg.Connection[Any],
    sql_worker: SqlWorker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_sql, "LISTEN_DONE", "LISTEN")
    run_id = start(conn)
    with caplog.at_level(logging.WARNING, logger="treadle"):
        waiter = Background(
            lambda: treadle.wait_workflow(with_app_name(dsn, "run-refused"), run_id, poll_interval=0.05)
        )
        until_run_read(conn, backend_of(conn, "run-refused"))
        finish_run(sql_worker, run_id)
        assert waiter.outcome() == RESULTS
    assert sum("LISTEN refused" in record.getMessage() for record in caplog.records) == 1


def test_finished_runs_answer_at_once(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    done = start(conn, "done")
    finish_run(sql_worker, done)
    assert treadle.wait_workflow(conn, done, timeout=0) == RESULTS

    failed = start(conn, "failing", max_attempts=1)
    finish_step(sql_worker, failed, RESULTS["reserve"])
    assert sql_worker.fail(pending_step(conn, failed), "card declined") == "discarded"
    with pytest.raises(treadle.WorkflowFailed) as run_failed:
        treadle.wait_workflow(conn, failed, timeout=0)
    assert (run_failed.value.run_id, run_failed.value.step, run_failed.value.error) == (
        failed,
        "charge",
        "card declined",
    )
    assert "card declined" in str(run_failed.value) and "'charge'" in str(run_failed.value)
    assert isinstance(run_failed.value, treadle.TreadleError)

    cancelled = start(conn, "dropped")
    assert treadle.cancel_workflow(conn, cancelled)
    with pytest.raises(treadle.WorkflowCancelled) as run_cancelled:
        treadle.wait_workflow(conn, cancelled, timeout=0)
    assert run_cancelled.value.run_id == cancelled
    assert isinstance(run_cancelled.value, treadle.TreadleError)


def test_sync_connection_borrowed_for_listen_sees_the_failing_step(
    conn: psycopg.Connection[Any], dsn: str, sql_worker: SqlWorker
) -> None:
    run_id = start(conn, max_attempts=1)
    with psycopg.connect(dsn, autocommit=True) as caller:
        waiter = Background(lambda: treadle.wait_workflow(caller, run_id, poll_interval=HOUR))
        until_run_read(conn, caller.info.backend_pid)
        # a job finishing on another queue is no news for this run: the waiter reads again and waits on
        other = treadle.enqueue(conn, "elsewhere", queue="mail")
        sql_worker.complete(other)
        finish_step(sql_worker, run_id, RESULTS["reserve"])
        assert sql_worker.fail(pending_step(conn, run_id), "card declined") == "discarded"
        with pytest.raises(treadle.WorkflowFailed) as run_failed:
            waiter.outcome()
        assert (run_failed.value.step, run_failed.value.error) == ("charge", "card declined")
        # LISTEN was undone, and no stale hint is left for the caller
        assert caller.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        assert list(caller.notifies(timeout=0)) == []
    assert run_row(conn, run_id)[0] == "failed"


def test_a_retried_step_resumes_the_run_and_the_wait(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(conn, max_attempts=1)
    finish_step(sql_worker, run_id, RESULTS["reserve"])
    charge = pending_step(conn, run_id)
    sql_worker.fail(charge, "card declined")
    with pytest.raises(treadle.WorkflowFailed, match="card declined"):
        treadle.wait_workflow(dsn, run_id, timeout=PATIENCE)
    assert treadle.retry(conn, charge)
    waiter = Background(lambda: treadle.wait_workflow(with_app_name(dsn, "resumed"), run_id, poll_interval=HOUR))
    until_run_read(conn, backend_of(conn, "resumed"))
    finish_step(sql_worker, run_id, RESULTS["charge"])
    finish_step(sql_worker, run_id, RESULTS["ship"])
    assert waiter.outcome() == RESULTS


def test_timeout_leaves_the_run_alone(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    run_id = start(conn)
    finish_step(sql_worker, run_id, RESULTS["reserve"])
    before = conn.execute(
        "SELECT id, state, attempt, cancel_requested FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id",
        [run_id],
    ).fetchall()
    with pytest.raises(treadle.WaitTimeout) as timed_out:
        treadle.wait_workflow(dsn, run_id, timeout=0.2, poll_interval=0.05)
    assert (timed_out.value.run_id, timed_out.value.job_id, timed_out.value.timeout) == (run_id, None, 0.2)
    assert str(timed_out.value) == f"workflow run {run_id} did not finish within 0.2 s"
    assert isinstance(timed_out.value, TimeoutError)
    with pytest.raises(treadle.WaitTimeout):
        treadle.wait_workflow(conn, run_id, timeout=0)
    assert run_row(conn, run_id) == ("running", {"reserve": RESULTS["reserve"]}, None)
    assert (
        conn.execute(
            "SELECT id, state, attempt, cancel_requested FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id",
            [run_id],
        ).fetchall()
        == before
    )
    # waiting again later picks the same run up
    finish_step(sql_worker, run_id, RESULTS["charge"])
    finish_step(sql_worker, run_id, RESULTS["ship"])
    assert treadle.wait_workflow(dsn, run_id, timeout=PATIENCE) == RESULTS


def test_unknown_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(treadle.WorkflowNotFound) as not_found:
        treadle.wait_workflow(dsn, 424242, timeout=PATIENCE)
    assert not_found.value.run_id == 424242 and isinstance(not_found.value, LookupError)
    assert str(not_found.value) == "no workflow run with id 424242"
    with pytest.raises(treadle.WorkflowNotFound):
        treadle.wait_workflow(conn, 424242)
    # a job id is not a run id
    job_id = treadle.enqueue(conn, "x")
    with pytest.raises(treadle.WorkflowNotFound):
        treadle.wait_workflow(conn, job_id)


def test_inside_the_callers_transaction_it_polls_and_leaves_it_open(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(conn)
    with psycopg.connect(dsn) as caller:
        caller.execute("CREATE TABLE mine (v int)")
        caller.execute("INSERT INTO mine VALUES (1)")
        waiter = Background(lambda: treadle.wait_workflow(caller, run_id, poll_interval=0.05))
        until_run_read(conn, caller.info.backend_pid)
        finish_run(sql_worker, run_id)
        assert waiter.outcome() == RESULTS
        assert caller.info.transaction_status == TransactionStatus.INTRANS
        assert caller.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        caller.commit()
    assert conn.execute("SELECT count(*) FROM mine").fetchone() == (1,)


def test_a_non_autocommit_idle_connection_is_left_idle(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(conn)
    with psycopg.connect(dsn) as caller:
        with pytest.raises(treadle.WaitTimeout):
            treadle.wait_workflow(caller, run_id, timeout=0.1, poll_interval=0.05)
        assert caller.info.transaction_status == TransactionStatus.IDLE
        finish_run(sql_worker, run_id)
        assert treadle.wait_workflow(caller, run_id, poll_interval=0.05) == RESULTS
        assert caller.info.transaction_status == TransactionStatus.IDLE


def test_a_repeatable_read_transaction_is_refused(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn)
    with psycopg.connect(dsn) as caller:
        caller.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        caller.execute("SELECT 1")
        with pytest.raises(
            treadle.InvalidArgument, match=r"wait_workflow cannot see .* the workflow run .* repeatable read"
        ):
            treadle.wait_workflow(caller, run_id, timeout=PATIENCE)
        assert caller.info.transaction_status == TransactionStatus.INTRANS


def test_async_wait_borrows_listen_and_sees_a_cancel(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(conn)
    finish_step(sql_worker, run_id, RESULTS["reserve"])
    charge = pending_step(conn, run_id)

    async def scenario() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            waiting = asyncio.ensure_future(treadle.wait_workflow(aconn, run_id, poll_interval=HOUR))

            def cancel_the_running_step() -> None:
                until_run_read(conn, aconn.info.backend_pid)
                token = sql_worker.claim(charge)
                assert treadle.cancel_workflow(conn, run_id)  # asked while the step runs
                assert sql_worker.conn.execute(
                    "SELECT treadle.complete(%s, %s, %s)", [charge, token, Jsonb({"paid": 0})]
                ).fetchone() == ("cancelled",)

            await asyncio.to_thread(cancel_the_running_step)
            with pytest.raises(treadle.WorkflowCancelled) as run_cancelled:
                await asyncio.wait_for(waiting, PATIENCE)
            listening = await (await aconn.execute("SELECT count(*) FROM pg_listening_channels()")).fetchone()
            return run_cancelled.value.run_id, listening

    assert asyncio.run(scenario()) == (run_id, (0,))


def test_async_wait_in_a_transaction_and_outcomes(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    failed = start(conn, "failing", max_attempts=1)
    sql_worker.fail(pending_step(conn, failed), "out of stock")
    run_id = start(conn)

    async def scenario() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with pytest.raises(treadle.WorkflowFailed) as run_failed:
                await treadle.wait_workflow(aconn, failed)
            assert (run_failed.value.step, run_failed.value.error) == ("reserve", "out of stock")
            assert aconn.info.transaction_status == TransactionStatus.IDLE  # its read was rolled back
            with pytest.raises(treadle.WorkflowNotFound):
                await treadle.wait_workflow(aconn, 424242)
            await aconn.execute("SELECT 1")  # now inside a transaction: polls
            waiting = asyncio.ensure_future(treadle.wait_workflow(aconn, run_id, poll_interval=0.05))

            def finish() -> None:
                until_run_read(conn, aconn.info.backend_pid)
                finish_run(sql_worker, run_id)

            await asyncio.to_thread(finish)
            result = await asyncio.wait_for(waiting, PATIENCE)
            assert transaction_status(aconn) == TransactionStatus.INTRANS
            with pytest.raises(treadle.WaitTimeout) as timed_out:
                await treadle.wait_workflow(aconn, start(conn, "slow"), timeout=0.1, poll_interval=0.05)
            assert timed_out.value.job_id is None
            return result

    assert asyncio.run(scenario()) == RESULTS


@pytest.mark.extension_only  # drops or replaces the extension
def test_a_database_without_the_extension(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP EXTENSION treadle")
    with pytest.raises(treadle.ExtensionMissing):
        treadle.wait_workflow(dsn, 1, timeout=PATIENCE)
    with pytest.raises(treadle.ExtensionMissing):
        treadle.wait_workflow(conn, 1, timeout=PATIENCE)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"run_id": "1"}, "run_id must be an integer"),
        ({"run_id": True}, "run_id must be an integer"),
        ({"run_id": 2**63}, "run_id must be between"),
        ({"timeout": -1}, "timeout must be at least 0"),
        ({"timeout": float("nan")}, "timeout must be a finite number"),
        ({"timeout": "5"}, "timeout must be a number of seconds or a timedelta"),
        ({"poll_interval": 0}, "poll_interval must be positive"),
        ({"listen": "yes"}, "listen must be True or False"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    call: dict[str, Any] = {"run_id": 1, **kwargs}
    with pytest.raises(treadle.InvalidArgument, match=message):
        treadle.wait_workflow("postgresql://refused-before-connecting/", **call)


def test_not_a_connection() -> None:
    with pytest.raises(TypeError, match="psycopg Connection or AsyncConnection"):
        treadle.wait_workflow(42, 1)  # type: ignore[call-overload]
