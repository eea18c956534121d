"""A batch's list steps move their runs together (treadle._advance_lists, 051_workflow_lists.sql):
the runs are locked in id order (descending: 053_workflow_lock_order.sql), whatever the order of
the steps, and a run that another session changed while the batch waited for it is moved from
what that session committed."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect, WaitBlocked, value

STEPS = ["a", "b", "c"]


def start(conn: psycopg.Connection, queue: str) -> int:
    run_id: int = value(conn, "select treadle.start_workflow('lin', steps => %s, queue => %s)", (STEPS, queue))
    return run_id


def held(conn: psycopg.Connection, queue: str) -> dict[int, tuple[int, Any]]:
    """Claim every available job of the queue: run id -> (job id, lease token)."""
    rows = conn.execute(
        "select workflow_run_id, id, lease_token from treadle.claim('w', array[%s], batch => 100)", (queue,)
    ).fetchall()
    return {run_id: (job_id, token) for run_id, job_id, token in rows}


def steps(conn: psycopg.Connection, run_id: int) -> list[tuple[str, str]]:
    return conn.execute(
        "select step, state from treadle.jobs where workflow_run_id = %s order by id", (run_id,)
    ).fetchall()


def complete_in_thread(conn: psycopg.Connection, jobs: list[tuple[int, Any]]) -> tuple[threading.Thread, list[Any]]:
    answer: list[Any] = []
    thread = threading.Thread(
        target=lambda: answer.append(
            conn.execute(
                "select array_agg(state order by job_id) from treadle.complete_many(%s, %s)",
                ([j for j, _ in jobs], [t for _, t in jobs]),
            ).fetchone()
        )
    )
    thread.start()
    return thread, answer


def test_a_batch_locks_its_runs_in_id_order_whatever_the_order_of_its_steps(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    worker, holder, prober = connect(), connect(autocommit=False), connect(autocommit=False)
    first, second = start(worker, "order"), start(worker, "order")
    a = held(worker, "order")
    # the first run's step finishes first, so its next step's job has the lower id
    assert value(worker, "select treadle.complete(%s, %s)", a[first]) == "completed"
    assert value(worker, "select treadle.complete(%s, %s)", a[second]) == "completed"
    b = held(worker, "order")
    assert b[first][0] < b[second][0]

    holder.execute("select 1 from treadle.workflow_runs where id = %s for update", (second,))
    thread, answer = complete_in_thread(worker, [b[first], b[second]])
    wait_until_blocked(worker.info.backend_pid)
    # the batch waits for the second run (the higher id) before it locked the first (a
    # batch that locked in the steps' order would hold the first run now)
    try:
        prober.execute("select 1 from treadle.workflow_runs where id = %s for update nowait", (first,))
        first_free = True
    except psycopg.errors.LockNotAvailable:
        first_free = False
    prober.rollback()
    holder.commit()
    thread.join(60)
    assert first_free, "the batch locked the first run before the second"
    assert answer == [(["completed", "completed"],)]
    for run_id in (first, second):
        assert steps(worker, run_id) == [("a", "completed"), ("b", "completed"), ("c", "available")]


def test_a_run_changed_while_the_batch_waits_is_moved_from_what_was_committed(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    worker, other = connect(), connect(autocommit=False)
    kept, stopped, plain = start(worker, "epq"), start(worker, "epq"), start(worker, "epq")
    a = held(worker, "epq")
    # another session writes to two of the runs and holds them: a result of its own on
    # one, the other no longer running
    other.execute("update treadle.workflow_runs set results = results || '{\"mark\": 1}' where id = %s", (kept,))
    other.execute(
        "update treadle.workflow_runs set state = 'cancelled', finished_at = treadle.now() where id = %s", (stopped,)
    )
    thread, answer = complete_in_thread(worker, [a[kept], a[stopped], a[plain]])
    wait_until_blocked(worker.info.backend_pid)
    other.commit()
    thread.join(60)
    assert answer == [(["completed", "completed", "completed"],)]
    assert value(worker, "select results from treadle.workflow_runs where id = %s", (kept,)) == {"mark": 1, "a": None}
    assert steps(worker, kept) == [("a", "completed"), ("b", "available")]
    # a run that stopped running records nothing and enqueues nothing (as one step alone)
    assert value(worker, "select results from treadle.workflow_runs where id = %s", (stopped,)) == {}
    assert steps(worker, stopped) == [("a", "completed")]
    assert steps(worker, plain) == [("a", "completed"), ("b", "available")]


def test_complete_and_claim_moves_a_batch_of_list_steps_and_tells_of_the_steps_its_claim_left(
    connect: Connect,
) -> None:
    worker, listener = connect(), connect()
    listener.execute("listen treadle_jobs")
    runs = [start(worker, "cycle") for _ in range(3)]
    a = held(worker, "cycle")
    list(listener.notifies(timeout=0.2))  # what the starts told
    rows = worker.execute(
        "select finished_id, finished_state, (job).step, (job).workflow_run_id"
        " from treadle.complete_and_claim(%s, %s, null, 'w', array['cycle'], batch => 1)",
        ([a[r][0] for r in runs], [a[r][1] for r in runs]),
    ).fetchall()
    assert rows[:3] == [(a[r][0], "completed", None, None) for r in runs]
    assert len(rows) == 4 and rows[3][:3] == (None, None, "b")
    taken = rows[3][3]
    for run_id in runs:
        assert steps(worker, run_id) == [("a", "completed"), ("b", "running" if run_id == taken else "available")]
    # the two steps its claim left wake the queue's workers, once
    assert [(n.channel, n.payload) for n in listener.notifies(timeout=1)] == [("treadle_jobs", "cycle")]
