"""Retention by the worker's housekeeping: a real worker process deletes finished work
past its retention in small batches (treadle.apply_retention), keeps what is not past
it and moves that to the history (treadle.archive), and does nothing of the kind when
retention_interval is None."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.worker.worker_support import Child, enqueue, until_state, wait_for
from treadle import Worker
from treadle.errors import InvalidArgument

pytestmark = pytest.mark.subprocess

OLD_JOBS = 250  # more than two batches of 100: the worker goes on while there is more


def finish_ten_days_ago(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Completed and discarded jobs and a completed run, all finished 10 days ago, and a
    job completed now; their ids."""
    conn.execute("select set_config('treadle.now', (now() - interval '10 days')::text, false)")
    conn.execute(
        "select treadle.enqueue_many((select jsonb_agg(jsonb_build_object('name', 'x', 'queue', 'old')) "
        "from generate_series(1, %s)))",
        (OLD_JOBS,),
    )
    old = []
    while rows := conn.execute("select id, lease_token from treadle.claim('w', array['old'], batch => 100)").fetchall():
        conn.execute(
            "select treadle.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows])
        )
        old += [r[0] for r in rows]
    discarded = enqueue(conn, "x", queue="old-failed", max_attempts=1)
    conn.execute("select treadle.fail(id, lease_token, 'boom') from treadle.claim('w', array['old-failed'])")
    run_id = conn.execute(
        "select treadle.start_workflow('flow', steps => array['a', 'b'], queue => 'old-runs')"
    ).fetchone()[0]  # type: ignore[index]
    for _ in range(2):
        conn.execute("select treadle.complete(id, lease_token) from treadle.claim('w', array['old-runs'])")
    conn.execute("select set_config('treadle.now', '', false)")
    recent = enqueue(conn, "x", queue="recent")
    conn.execute("select treadle.complete(id, lease_token) from treadle.claim('w', array['recent'])")
    return {"old": old, "discarded": discarded, "run": run_id, "recent": recent}


def count(conn: psycopg.Connection[Any], sql: str, *params: Any) -> int:
    return int(conn.execute(sql, params).fetchone()[0])  # type: ignore[index]


def test_the_worker_deletes_finished_work_past_its_retention(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    made = finish_ten_days_ago(conn)
    assert len(made["old"]) == OLD_JOBS
    child = spawn("keeper", retention=0.2, retention_batch=100)

    wait_for(
        lambda: count(conn, "select count(*) from treadle.job_details where id = any(%s)", made["old"]) == 0,
        "the worker deleted every job completed 10 days ago",
    )
    wait_for(
        lambda: count(conn, "select count(*) from treadle.workflow_runs where id = %s", made["run"]) == 0,
        "and the run completed 10 days ago",
    )
    assert count(conn, "select count(*) from treadle.jobs where workflow_run_id = %s", made["run"]) == 0
    wait_for(
        lambda: count(conn, "select count(*) from treadle.job_history where id = %s", made["discarded"]) == 1,
        "a job discarded 10 days ago stays, moved to the history: failures are kept 30 days",
    )
    assert count(conn, "select count(*) from treadle.jobs where id = %s", made["discarded"]) == 0
    assert count(conn, "select count(*) from treadle.job_details where id = %s", made["discarded"]) == 1
    assert count(conn, "select count(*) from treadle.jobs where id = %s", made["recent"]) == 1, (
        "a job finished now stays in treadle.jobs: archive moves jobs finished over a minute ago"
    )
    # the worker still works, and says what retention did
    job_id = enqueue(conn, "record", {})
    until_state(conn, job_id, "completed")
    assert "finished jobs past their retention" in child.log()
    assert child.log().count("deleted 100 finished jobs") >= 2, "in batches of 100"


def test_a_worker_with_retention_off_deletes_nothing(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    made = finish_ten_days_ago(conn)
    child = spawn("no-retention", retention="off")
    # the worker runs: a job goes through it, and its housekeeping has turned many times
    for _ in range(3):
        until_state(conn, enqueue(conn, "record", {"seconds": 0.3}), "completed")
    assert count(conn, "select count(*) from treadle.jobs where id = any(%s)", made["old"]) == OLD_JOBS
    assert count(conn, "select count(*) from treadle.jobs where id = %s", made["discarded"]) == 1, "nor moved"
    assert "past their retention" not in child.log()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retention_interval": 0}, "retention_interval must be positive"),
        ({"retention_interval": -1}, "retention_interval must be positive"),
        ({"retention_interval": float("nan")}, "retention_interval must be a finite number"),
        ({"retention_interval": "60"}, "retention_interval must be a number of seconds"),
        ({"retention_batch": 0}, "retention_batch must be between 1 and 100000"),
        ({"retention_batch": 100_001}, "retention_batch must be between 1 and 100000"),
        ({"retention_batch": True}, "retention_batch must be an integer"),
        ({"retention_batch": None}, "retention_batch must be an integer"),
    ],
)
def test_bad_retention_options_are_refused(dsn: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Worker(dsn, **options)
