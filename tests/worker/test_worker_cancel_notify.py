"""A cancel reaches a running handler within a second, through a notification to its worker.

treadle.cancel (and treadle.cancel_workflow, which calls it for each running step)
sends NOTIFY treadle_cancel with the job id; the worker that runs the job heartbeats
it at once, and the heartbeat's answer 'cancel' sets the handler's ctx.cancelled. The
workers here heartbeat every 30 seconds, so only the notification can stop the
handler in time. A notification alone (anyone may send one) is only a hint: without a
cancel request the heartbeat says the job holds, and the handler goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.worker.worker_support import Child, effects, enqueue, until_run_finished, until_state, wait_for

pytestmark = pytest.mark.subprocess

# heartbeats far apart: a handler that stops within a second was told by the notification
SLOW_BEATS = {"lease": 90, "heartbeat": 30}
STOP_WITHIN = timedelta(seconds=1)


def running(conn: psycopg.Connection[Any], job_id: int) -> None:
    wait_for(lambda: effects(conn, "ran", job_id=job_id), f"job {job_id} to run")


def now(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def lease_until(conn: psycopg.Connection[Any], job_id: int) -> Any:
    row = conn.execute("SELECT lease_until FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return row[0]


def aborted_after(conn: psycopg.Connection[Any], job_id: int, since: Any) -> timedelta:
    """How long after `since` (the server's clock) the handler of `job_id` saw its cancel."""
    rows = wait_for(lambda: effects(conn, "aborted", job_id=job_id), f"job {job_id}'s handler to see its cancel")
    elapsed: timedelta = rows[0]["at"] - since
    return elapsed


def test_a_cancel_reaches_a_running_handler_within_a_second(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    child = spawn("canceller-target", concurrency=1, **SLOW_BEATS)
    job_id = enqueue(conn, "record", {"seconds": 600})
    running(conn, job_id)
    assert conn.execute("SELECT treadle.cancel(%s)", [job_id]).fetchone() == (True,)
    since = now(conn)
    elapsed = aborted_after(conn, job_id, since)
    assert elapsed < STOP_WITHIN, f"the handler saw the cancel after {elapsed}; log:\n{child.log()}"
    row = until_state(conn, job_id, "cancelled")
    assert row["attempt"] == 1


def test_cancel_workflow_reaches_a_running_step_within_a_second(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    child = spawn("step-target", concurrency=1, **SLOW_BEATS)
    row = conn.execute("SELECT treadle.start_workflow('long', '{\"seconds\": 600}', steps => array['work'])").fetchone()
    assert row is not None
    run_id = int(row[0])
    job_id = wait_for(
        lambda: conn.execute(
            "SELECT id FROM treadle.jobs WHERE workflow_run_id = %s AND state = 'running'", [run_id]
        ).fetchone(),
        "the step to be claimed",
    )[0]
    running(conn, job_id)
    assert conn.execute("SELECT treadle.cancel_workflow(%s)", [run_id]).fetchone() == (True,)
    since = now(conn)
    elapsed = aborted_after(conn, job_id, since)
    assert elapsed < STOP_WITHIN, f"the step saw the cancel after {elapsed}; log:\n{child.log()}"
    assert until_run_finished(conn, run_id)["state"] == "cancelled"


def test_a_notification_without_a_cancel_changes_nothing(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    child = spawn("forged-target", concurrency=1, **SLOW_BEATS)
    job_id = enqueue(conn, "record", {"seconds": 600})
    running(conn, job_id)
    lease_before = lease_until(conn, job_id)
    # anyone may NOTIFY: the worker heartbeats the job at once, and the database says it holds
    conn.execute("SELECT pg_notify('treadle_cancel', %s)", [str(job_id)])
    conn.execute("SELECT pg_notify('treadle_cancel', 'not a job id')")
    wait_for(lambda: lease_until(conn, job_id) > lease_before, "the heartbeat the notification asked for", timeout=5)
    time.sleep(0.5)
    assert effects(conn, "aborted", job_id=job_id) == []
    assert conn.execute("SELECT state, cancel_requested FROM treadle.jobs WHERE id = %s", [job_id]).fetchone() == (
        "running",
        False,
    )
    # the real cancel still reaches it
    conn.execute("SELECT treadle.cancel(%s)", [job_id])
    since = now(conn)
    assert aborted_after(conn, job_id, since) < STOP_WITHIN, child.log()
