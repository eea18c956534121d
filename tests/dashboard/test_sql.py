"""The dashboard's SQL: job_counts (exact and estimated), job_details, workflow_run_steps, grants."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.dashboard.seeding import Seeded, claim, enqueue, one
from treadle.dashboard.formatting import blocks_lane, can_cancel, can_retry
from treadle.models import JOB_STATES


def counts(conn: psycopg.Connection, exact_up_to: int = 100_000) -> dict[tuple[str | None, str], tuple[int, bool]]:
    rows = conn.execute("SELECT queue, state, jobs, estimated FROM treadle.job_counts(%s)", (exact_up_to,)).fetchall()
    return {(q, s): (n, e) for q, s, n, e in rows}


def test_counts_are_exact_on_a_small_table(conn: psycopg.Connection, seeded: Seeded) -> None:
    got = counts(conn)
    totals = {
        s: got[(None, s)]
        for s in ("available", "running", "retryable", "completed", "discarded", "cancelled", "blocked")
    }
    expected: dict[str, int] = dict(conn.execute("SELECT state, count(*) FROM treadle.jobs GROUP BY state").fetchall())
    assert {s: n for s, (n, _) in totals.items()} == {s: expected.get(s, 0) for s in totals}
    assert not any(e for _, e in got.values())
    assert got[("mail", "available")] == (1, False)
    assert got[("media", "running")] == (1, False)
    assert ("mail", "completed") not in got  # only states a queue has


def test_counts_give_every_state_total_on_an_empty_table(conn: psycopg.Connection) -> None:
    rows = conn.execute("SELECT queue, state, jobs, estimated FROM treadle.job_counts()").fetchall()
    assert rows == [
        (None, s, 0, False)
        for s in ("available", "running", "retryable", "completed", "discarded", "cancelled", "blocked")
    ]


def test_oldest_waiting_age_belongs_to_queues_with_due_work(conn: psycopg.Connection) -> None:
    conn.execute("SELECT set_config('treadle.now', '2030-01-01 12:00:00+00', false)")
    conn.execute("SELECT treadle.enqueue('a', queue => 'mail', run_at => '2030-01-01 12:00:00+00')")
    conn.execute("SELECT treadle.enqueue('later', queue => 'mail', run_at => '2030-01-01 13:00:00+00')")
    enqueue(conn, "b", "media")
    claim(conn, "media")
    conn.execute("SELECT set_config('treadle.now', '2030-01-01 12:05:00+00', false)")
    ages = {
        q: age
        for q, age in conn.execute(
            "SELECT queue, oldest_available_age FROM treadle.job_counts() WHERE queue IS NOT NULL"
        ).fetchall()
    }
    assert ages["mail"].total_seconds() == 300  # the job scheduled for later is not waiting yet
    assert ages["media"] is None


def test_large_tables_estimate_finished_states_and_say_so(conn: psycopg.Connection) -> None:
    # 600 finished jobs over two queues with different mixes, and a little waiting work
    conn.execute(
        """
        INSERT INTO treadle.jobs (queue, name, state, run_at, created_at, finished_at)
        SELECT CASE WHEN g <= 400 THEN 'mail' ELSE 'media' END, 'n',
               CASE WHEN g <= 400 THEN 'completed' ELSE 'discarded' END,
               now(), now(), now()
          FROM generate_series(1, 600) AS g
        """
    )
    for _ in range(3):
        enqueue(conn, "w", "mail")
    conn.execute("ANALYZE treadle.jobs")
    got = counts(conn, exact_up_to=100)
    assert got[(None, "available")] == (3, False)  # waiting work is small: counted from its index
    assert got[("mail", "available")] == (3, False)
    completed, estimated = got[(None, "completed")]
    assert estimated and 300 <= completed <= 500
    discarded, estimated = got[(None, "discarded")]
    assert estimated and 150 <= discarded <= 250
    # per queue, the joint statistics keep each queue's own mix
    mail_completed, estimated = got[("mail", "completed")]
    assert estimated and 300 <= mail_completed <= 500
    media_discarded, estimated = got[("media", "discarded")]
    assert estimated and 150 <= media_discarded <= 250
    # with a higher bound the same table is counted exactly again
    assert counts(conn, exact_up_to=1000)[(None, "completed")] == (400, False)


@pytest.mark.parametrize(
    ("bound", "sqlstate"),
    [("NULL", "22004"), ("-1", "22023")],
)
def test_counts_refuse_a_bad_bound(conn: psycopg.Connection, bound: str, sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(f"SELECT * FROM treadle.job_counts({bound})")
    assert caught.value.sqlstate == sqlstate


def test_job_details_hide_the_lease_token(conn: psycopg.Connection, seeded: Seeded) -> None:
    columns = [
        c.name
        for c in conn.execute("SELECT * FROM treadle.job_details WHERE id = %s", (seeded.running,)).description or []
    ]
    assert "lease_token" not in columns
    row = conn.execute(
        "SELECT state, progress, progress_message, worker_id FROM treadle.job_details WHERE id = %s", (seeded.running,)
    ).fetchone()
    assert row == ("running", 0.4, "resizing", "worker-a")


def test_run_steps_list_every_step_in_order(conn: psycopg.Connection, seeded: Seeded) -> None:
    rows = conn.execute(
        "SELECT position, step, state, has_result, result, last_error, job_id IS NOT NULL"
        "  FROM treadle.workflow_run_steps WHERE run_id = %s ORDER BY position",
        (seeded.failed_run,),
    ).fetchall()
    assert rows == [
        (1, "reserve", "completed", True, {"hold": "h-1"}, None, True),
        (2, "charge", "discarded", False, None, "PaymentError: card expired", True),
        (3, "ship", "pending", False, None, None, False),
    ]


def test_grant_dashboard_lets_a_role_read_what_the_dashboard_reads(conn: psycopg.Connection, seeded: Seeded) -> None:
    role = f"dash_{conn.info.dbname[-12:]}"
    conn.execute(f'CREATE ROLE "{role}"')
    try:
        conn.execute("SELECT treadle.grant_dashboard(%s, read_only => true)", (role,))
        as_owner = conn.execute("SELECT count(*) FROM treadle.job_counts()").fetchone()
        with conn.transaction():
            conn.execute(f'SET LOCAL ROLE "{role}"')
            assert conn.execute("SELECT count(*) FROM treadle.job_counts()").fetchone() == as_owner
            assert conn.execute("SELECT count(*) FROM treadle.job_details").fetchone() is not None
            assert conn.execute("SELECT count(*) FROM treadle.workflow_run_steps").fetchone() == (5,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute(f'SET LOCAL ROLE "{role}"')
            conn.execute("SELECT treadle.retry(%s)", (seeded.discarded,))
    finally:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def test_the_job_states_are_the_tables(conn: psycopg.Connection) -> None:
    definition = one(conn, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'jobs_state_check'")
    assert tuple(re.findall(r"'(\w+)'::text", definition)) == JOB_STATES


def test_the_pages_offer_retry_and_cancel_exactly_where_the_functions_apply(
    conn: psycopg.Connection, seeded: Seeded
) -> None:
    cancel_requested = enqueue(conn, "long_export", "exports")
    claim(conn, "exports")
    conn.execute("SELECT treadle.cancel(%s)", (cancel_requested,))
    conn.execute("SELECT treadle.set_queue('lanes', key_ordered => true)")
    lane_head = one(conn, "SELECT treadle.enqueue('hook', queue => 'lanes', concurrency_key => 'k', max_attempts => 1)")
    conn.execute("SELECT treadle.enqueue('hook', queue => 'lanes', concurrency_key => 'k')")
    head, token = claim(conn, "lanes")
    assert head == lane_head and one(conn, "SELECT treadle.fail(%s, %s::uuid, 'down')", head, token) == "discarded"
    every_state = [seeded.available, seeded.running, seeded.retryable, seeded.discarded, seeded.completed]
    jobs = [*every_state, seeded.cancelled, cancel_requested, lane_head]  # a running job asked to cancel, a lane's head
    with conn.cursor(row_factory=dict_row) as cur:
        for job_id in jobs:
            job = cur.execute("SELECT * FROM treadle.job_details WHERE id = %s", (job_id,)).fetchone()
            assert job is not None
            reasons = cur.execute("SELECT reason FROM treadle.explain(%s)", (job_id,)).fetchall()
            cancel = can_cancel(job, blocks_lane(job, reasons))
            for action, offered in (("retry", can_retry(job)), ("cancel", cancel)):
                with conn.transaction(force_rollback=True):
                    applied = cur.execute(f"SELECT treadle.{action}(%s) AS changed", (job_id,)).fetchone()
                assert applied is not None and applied["changed"] is offered, (action, job["state"])
