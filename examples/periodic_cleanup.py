"""A periodic cleanup job: delete expired sessions, and prune old finished jobs.

`every` makes a job periodic. When an occurrence finishes, the statement that finishes
it also enqueues the next one, due `every` after that. A series therefore has one
pending occurrence at a time and never runs twice at once, however many workers run.

The series is started once: `ensure_series` takes an advisory lock and starts it only
when no occurrence is pending, so every process may call it at start-up. The example
uses a period of one second so that it finishes quickly, then cancels the pending
occurrence, which ends the series.

    DATABASE_URL=postgresql://localhost/app python examples/periodic_cleanup.py
"""

from __future__ import annotations

import os
from datetime import timedelta

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "maintenance"
NAME = "expire_sessions"


def setup() -> None:
    with psycopg.connect(DSN) as conn:
        conn.execute("""
            create table if not exists pc_sessions (
                id         bigint generated always as identity primary key,
                expires_at timestamptz not null
            )""")


def add_sessions(expired: int, live: int) -> None:
    with psycopg.connect(DSN) as conn:
        conn.execute(
            """insert into pc_sessions (expires_at)
               select now() - interval '1 hour' from generate_series(1, %s)
               union all
               select now() + interval '1 day' from generate_series(1, %s)""",
            [expired, live],
        )


def ensure_series(conn: psycopg.Connection) -> int:
    """The pending occurrence of the cleanup series, started if there is none."""
    conn.execute("select pg_advisory_xact_lock(hashtext('treadle series: expire_sessions'))")
    pending = conn.execute(
        """select id from treadle.jobs
            where name = %s and every is not null and state in ('available', 'retryable', 'running')""",
        [NAME],
    ).fetchone()
    if pending:
        return pending[0]
    return treadle.enqueue(conn, NAME, queue=QUEUE, every=timedelta(seconds=1))


def expire_sessions(args: dict, ctx: treadle.JobContext) -> dict:
    with psycopg.connect(DSN) as conn:
        deleted = conn.execute("delete from pc_sessions where expires_at < now()").rowcount
        # treadle.prune belongs to the admin part: treadle.grant_admin(role) gives it to
        # this worker's role (docs/operations.md#roles-and-grants).
        (pruned,) = conn.execute("select treadle.prune(older_than => '7 days')").fetchone()
    return {"sessions_deleted": deleted, "jobs_pruned": pruned}


def next_occurrence(conn: psycopg.Connection, job_id: int) -> int:
    (next_id,) = conn.execute("select next_id from treadle.jobs where id = %s", [job_id]).fetchone()
    return next_id


def main() -> None:
    setup()
    add_sessions(expired=3, live=1)
    with psycopg.connect(DSN) as conn:
        first = ensure_series(conn)
    with psycopg.connect(DSN) as conn:
        assert ensure_series(conn) == first, "a second start finds the pending occurrence"

    worker = treadle.Worker(DSN, queues=[QUEUE], poll_interval=0.2)
    worker.register(NAME, expire_sessions)
    with worker, psycopg.connect(DSN, autocommit=True) as conn:
        first_result = treadle.wait(DSN, first, timeout=60)
        print(f"occurrence {first}:", first_result)
        second = next_occurrence(conn, first)
        second_result = treadle.wait(DSN, second, timeout=60)
        print(f"occurrence {second}:", second_result)
        third = next_occurrence(conn, second)
        due_after = conn.execute(
            "select n.run_at - p.finished_at from treadle.jobs n, treadle.jobs p where n.id = %s and p.id = %s",
            [third, second],
        ).fetchone()[0]
        print(f"occurrence {third} is due {due_after.total_seconds():g} s after {second} finished")
        treadle.cancel(conn, third)  # ends the series
        pending = conn.execute(
            "select count(*) from treadle.jobs where name = %s and state in ('available', 'retryable', 'running')",
            [NAME],
        ).fetchone()[0]
        (left,) = conn.execute("select count(*) from pc_sessions where expires_at < now()").fetchone()

    assert first_result["sessions_deleted"] == 3 and second_result["sessions_deleted"] == 0
    assert due_after == timedelta(seconds=1), due_after
    assert pending == 0 and left == 0, (pending, left)
    print("expired sessions are gone; the series ended when its pending occurrence was cancelled")


if __name__ == "__main__":
    main()
