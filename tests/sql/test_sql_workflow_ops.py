"""retry_run and fork_run against other sessions: two retries of one run at once resume it
once (each failed step one job, attempt 0), and a fork of a run that goes on is not
touched by what the source does afterwards."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect, WaitBlocked, row, value


def finish(conn: psycopg.Connection, queue: str, result: str | None) -> None:
    """Claim one job of `queue` and complete it with `result`, or fail it for good (None)."""
    job_id, token = row(conn, "select id, lease_token from treadle.claim('w', array[%s])", (queue,))
    if result is None:
        conn.execute("select treadle.fail(%s, %s, 'boom', retryable => false)", (job_id, token))
    else:
        conn.execute("select treadle.complete(%s, %s, %s::jsonb)", (job_id, token, result))


def racing_retries(connect: Connect, wait_until_blocked: WaitBlocked, run_id: int) -> list[Any]:
    """retry_run from two sessions: the first holds its transaction open until the second waits on it."""
    first, second = connect(autocommit=False), connect()
    said = [value(first, "select treadle.retry_run(%s)", (run_id,))]
    thread = threading.Thread(target=lambda: said.append(value(second, "select treadle.retry_run(%s)", (run_id,))))
    thread.start()
    wait_until_blocked(second.info.backend_pid)
    first.commit()
    thread.join(60)
    assert not thread.is_alive()
    return said


def test_two_retries_of_a_failed_run_at_once_resume_it_once(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    conn = connect()
    run_id = value(
        conn,
        "select treadle.start_workflow('fan', steps => array['a', 'b', 'join'], queue => 'fan', max_attempts => 1,"
        ' after => \'{"join": ["a", "b"]}\')',
    )
    finish(conn, "fan", None)  # a fails for good, and the run with it
    finish(conn, "fan", None)  # b fails too, in the failed run
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "failed"

    assert racing_retries(connect, wait_until_blocked, run_id) == ["running", "running"]
    assert conn.execute(
        "select step, state, attempt from treadle.jobs where workflow_run_id = %s order by id", (run_id,)
    ).fetchall() == [("a", "available", 0), ("b", "available", 0)]


def test_two_retries_of_a_cancelled_sleeping_run_at_once_resume_it_once(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    conn = connect()
    run_id = value(
        conn,
        "select treadle.start_workflow('nap', steps => array['wait', 'go'], queue => 'nap',"
        ' sleeps => \'{"wait": "1 hour"}\')',
    )
    assert value(conn, "select treadle.cancel_workflow(%s)", (run_id,)) is True  # only a sleep under way
    assert racing_retries(connect, wait_until_blocked, run_id) == ["running", "running"]
    assert row(conn, "select state, wake_at is not null from treadle.workflow_runs where id = %s", (run_id,)) == (
        "running",
        True,
    )
    assert value(conn, "select count(*) from treadle.jobs where workflow_run_id = %s", (run_id,)) == 0


def test_a_fork_of_a_running_run_keeps_what_it_carried(connect: Connect) -> None:
    conn = connect()
    run_id = value(
        conn, "select treadle.start_workflow('trip', steps => array['book', 'pay', 'mail'], queue => 'trip')"
    )
    finish(conn, "trip", '"booked"')
    fork = value(conn, "select treadle.fork_run(%s, 'pay')", (run_id,))
    finish(conn, "trip", '"paid-by-source"')  # the source's pay (the older job) runs on
    assert row(conn, "select results, forked_from from treadle.workflow_runs where id = %s", (fork,)) == (
        {"book": "booked"},
        run_id,
    )
    assert conn.execute("select step, state from treadle.jobs where workflow_run_id = %s", (fork,)).fetchall() == [
        ("pay", "available")
    ]
