"""treadle.apply_retention across sessions: callers at once skip what another holds
(SKIP LOCKED) instead of waiting, count each job once, and take a workflow run only
with every one of its steps."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg

from tests.sql.sqlcalls import Connect, value

# Every session that deletes works 10 days after the jobs finished: past the default
# 7 days for completed work.
LATER = "select set_config('treadle.now', (now() + interval '10 days')::text, false)"
# A session that must never wait for a lock: a wait raises LockNotAvailable (55P03).
NO_WAITING = "set lock_timeout = '2s'"


def completed_jobs(conn: psycopg.Connection, count: int, queue: str = "old") -> list[int]:
    """`count` jobs of `queue`, completed now; their ids, oldest first."""
    conn.execute(
        "select treadle.enqueue_many((select jsonb_agg(jsonb_build_object('name', 'x', 'queue', %s::text)) "
        "from generate_series(1, %s)))",
        (queue, count),
    )
    done: list[int] = []
    while len(done) < count:
        rows = conn.execute(
            "select id, lease_token from treadle.claim('w', array[%s]::text[], batch => 100)", (queue,)
        ).fetchall()
        conn.execute(
            "select treadle.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows])
        )
        done += [r[0] for r in rows]
    return sorted(done)


def finished_run(conn: psycopg.Connection, steps: int = 3) -> int:
    """A workflow run whose `steps` steps completed now; its id."""
    names = [f"s{i}" for i in range(steps)]
    run_id = value(conn, "select treadle.start_workflow('flow', steps => %s, queue => 'flows')", (names,))
    for _ in names:
        conn.execute("select treadle.complete(id, lease_token) from treadle.claim('w', array['flows'])")
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "completed"
    return int(run_id)


def remaining(conn: psycopg.Connection, ids: list[int]) -> list[int]:
    return [r[0] for r in conn.execute("select id from treadle.jobs where id = any(%s) order by id", (ids,))]


def test_a_second_caller_skips_the_rows_the_first_holds(connect: Connect) -> None:
    setup = connect()
    ids = completed_jobs(setup, 4)
    first, second = connect(autocommit=False), connect()
    for session in (first, second):
        session.execute(LATER)
    second.execute(NO_WAITING)

    assert value(first, "select treadle.apply_retention(batch => 2)") == 2  # holds the two oldest, uncommitted
    assert value(second, "select treadle.apply_retention(batch => 2)") == 2  # does not wait: takes the next two
    assert remaining(setup, ids) == ids[:2], "the second caller deleted the two the first did not hold"
    first.commit()
    assert remaining(setup, ids) == []
    assert value(second, "select treadle.apply_retention(batch => 2)") == 0


def test_a_held_job_is_skipped_then_deleted_once_free(connect: Connect) -> None:
    setup = connect()
    ids = completed_jobs(setup, 3)
    holder, retention = connect(autocommit=False), connect()
    retention.execute(LATER)
    retention.execute(NO_WAITING)
    holder.execute("select 1 from treadle.jobs where id = %s for update", (ids[0],))

    assert value(retention, "select treadle.apply_retention()") == 2
    assert remaining(setup, ids) == [ids[0]], "the held job stays, the others go"
    holder.rollback()
    assert value(retention, "select treadle.apply_retention()") == 1
    assert remaining(setup, ids) == []


def test_a_run_goes_whole_or_not_at_all(connect: Connect) -> None:
    setup = connect()
    run_id = finished_run(setup, steps=3)
    steps = [r[0] for r in setup.execute("select id from treadle.jobs where workflow_run_id = %s", (run_id,))]
    assert len(steps) == 3
    holder, retention = connect(autocommit=False), connect()
    retention.execute(LATER)
    retention.execute(NO_WAITING)

    # someone holds one step (as a retry of it would): the run and all its steps stay
    holder.execute("select 1 from treadle.jobs where id = %s for update", (steps[1],))
    assert value(retention, "select treadle.apply_retention()") == 0
    assert value(setup, "select count(*) from treadle.workflow_runs where id = %s", (run_id,)) == 1
    assert remaining(setup, steps) == steps, "not one step of the held run is gone"

    # someone holds the run itself: the same
    holder.rollback()
    holder.execute("select 1 from treadle.workflow_runs where id = %s for update", (run_id,))
    assert value(retention, "select treadle.apply_retention()") == 0
    assert remaining(setup, steps) == steps

    holder.rollback()
    assert value(retention, "select treadle.apply_retention()") == 3, "the run's three step jobs are counted"
    assert value(setup, "select count(*) from treadle.workflow_runs where id = %s", (run_id,)) == 0
    assert remaining(setup, steps) == []


def test_callers_at_once_delete_every_job_once(connect: Connect) -> None:
    jobs, callers, batch = 3000, 6, 50
    setup = connect()
    ids = completed_jobs(setup, jobs)
    runs = [finished_run(setup, steps=2) for _ in range(20)]
    kept = completed_jobs(setup, 10, queue="kept")
    setup.execute("select treadle.set_queue('kept', retain_completed => '1 year')")
    sessions = [connect() for _ in range(callers)]
    for session in sessions:
        session.execute(LATER)
        session.execute(NO_WAITING)

    def until_done(session: psycopg.Connection) -> int:
        deleted = 0
        while (got := value(session, "select treadle.apply_retention(batch => %s)", (batch,))) > 0:
            assert got <= batch
            deleted += got
        return deleted

    with ThreadPoolExecutor(callers) as pool:
        counts = list(pool.map(until_done, sessions))
    assert sum(counts) == jobs + 2 * len(runs), "every job counted exactly once, step jobs included"
    assert remaining(setup, ids) == []
    assert value(setup, "select count(*) from treadle.workflow_runs where id = any(%s)", (runs,)) == 0
    assert remaining(setup, kept) == kept, "a queue's own longer retention holds"


def test_bad_batches_are_refused_and_delete_nothing(connect: Connect) -> None:
    setup = connect()
    ids = completed_jobs(setup, 2)
    retention = connect()
    retention.execute(LATER)
    for batch, sqlstate in ((None, "22004"), (0, "22023"), (-1, "22023"), (100_001, "22023"), (2**31 - 1, "22023")):
        try:
            retention.execute("select treadle.apply_retention(batch => %s::integer)", (batch,))
        except psycopg.Error as error:
            assert error.sqlstate == sqlstate, batch
        else:
            raise AssertionError(f"batch {batch} was accepted")
    assert remaining(setup, ids) == ids
