"""A graph step whose end cancels its run, while a worker finishes a sibling step at the same time.

The step's end locks its siblings' jobs before the run (as cancel_workflow does, as every
path does); it holds its own job, so it waits for no sibling's finish that holds one (that
finish may wait for it) and leaves the run's cancel for a re-check, and a sibling's finish
waits for it: whichever commits first, neither session deadlocks, the run ends cancelled,
and a sibling that completed first keeps its result.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect, WaitBlocked, row, value

FAN = "select treadle.start_workflow('fan', '{}', %s, queue => 'race', after => %s)"
STEPS = (["a", "c", "b", "j"], '{"j": ["a", "b", "c"]}')


def start(conn: psycopg.Connection) -> tuple[int, tuple[int, Any], tuple[int, Any]]:
    run_id = value(conn, FAN, STEPS)
    claimed = conn.execute(
        "select id, lease_token, step from treadle.claim('w', array['race'], batch => 10) order by id"
    ).fetchall()
    by_step = {r[2]: (r[0], r[1]) for r in claimed}
    # b goes back to waiting: a and c run
    conn.execute("select treadle.release(%s, %s)", by_step["b"])
    conn.execute("select treadle.cancel(%s)", (by_step["a"][0],))
    return run_id, by_step["a"], by_step["c"]


def steps(conn: psycopg.Connection, run_id: int) -> list[tuple[str, str]]:
    return conn.execute(
        "select step, state from treadle.jobs where workflow_run_id = %s order by step", (run_id,)
    ).fetchall()


def finish_in_thread(conn: psycopg.Connection, job: tuple[int, Any], result: str) -> tuple[threading.Thread, list[Any]]:
    answer: list[Any] = []

    def finish() -> None:
        try:
            answer.append(conn.execute("select treadle.complete(%s, %s, %s)", (*job, result)).fetchone())
            conn.commit()
        except psycopg.Error as error:  # a deadlock would land here
            answer.append(error)

    thread = threading.Thread(target=finish)
    thread.start()
    return thread, answer


def test_the_sibling_finishes_first(connect: Connect) -> None:
    setup, stopper, sibling = connect(), connect(autocommit=False), connect(autocommit=False)
    run_id, a, c = start(setup)
    assert sibling.execute("select treadle.complete(%s, %s, '3')", c).fetchone() == ("completed",)
    # a's finish holds a's job and waits for no other (the sibling holds c's): it leaves the
    # run's cancel for a re-check (073_workflow_cancel_rechecks.sql)
    thread, answer = finish_in_thread(stopper, a, "1")
    thread.join(60)
    assert answer == [("cancelled",)]
    assert row(setup, "select count(*) from treadle.run_rechecks where run_id = %s", (run_id,)) == (1,)
    sibling.commit()
    # which the next claim on the queue (its re-checks' move, first) moves: b is cancelled
    assert row(setup, "select treadle._move_rechecks(null)") == (1,)
    assert steps(setup, run_id) == [("a", "cancelled"), ("b", "cancelled"), ("c", "completed")]
    assert row(setup, "select state, results from treadle.workflow_runs where id = %s", (run_id,)) == (
        "cancelled",
        {"c": 3},
    )


def test_the_stopping_step_finishes_first(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    setup, stopper, sibling = connect(), connect(autocommit=False), connect(autocommit=False)
    run_id, a, c = start(setup)
    assert stopper.execute("select treadle.complete(%s, %s, '1')", a).fetchone() == ("cancelled",)
    thread, answer = finish_in_thread(sibling, c, "3")
    wait_until_blocked(sibling.info.backend_pid)  # on c's job, whose cancel the stopper requested
    stopper.commit()
    thread.join(60)
    assert answer == [("cancelled",)]  # its cancel was requested before it finished
    assert steps(setup, run_id) == [("a", "cancelled"), ("b", "cancelled"), ("c", "cancelled")]
    assert row(setup, "select state, results from treadle.workflow_runs where id = %s", (run_id,)) == ("cancelled", {})
