"""Every way a workflow run ends tells its waiters (treadle_done naming the run's queue).

A run ends by a step job's finish, but also where no job of its queue finishes: a
cancel of its waiting steps or of its sleeps, a sleep's end or a signal wait's
timeout in treadle.rescue, a signal, a compensation with nothing to undo, a step of
it that runs in a queue of its own. Each case here has two waiters, registered
before the end: a SQL session (treadle.listen_done, then LISTEN treadle_done) that
must hear the run's queue, and `wait_workflow` polling once an hour, so that only a
notification can end its wait while the test is still there to see it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import treadle
from tests.client.producer_support import Background, SqlWorker, backend_of, with_app_name
from tests.client.test_wait_workflow import HOUR, until_run_read

QUEUE = "ends"
ELSEWHERE = "ends-elsewhere"
HEARD_WITHIN = 10.0  # a bound on a notification sent at a commit (never a claim about speed)


def start(conn: psycopg.Connection[Any], steps: list[str], **options: Any) -> int:
    given = {key: Jsonb(value) for key, value in options.items()}
    names = ", ".join(f"{key} => %({key})s" for key in given)
    row = conn.execute(
        f"SELECT treadle.start_workflow('ends', steps => %(steps)s, queue => %(queue)s{', ' + names if names else ''})",
        {"steps": steps, "queue": QUEUE, **given},
    ).fetchone()
    assert row is not None
    return int(row[0])


def job_of(conn: psycopg.Connection[Any], run_id: int, step: str) -> int:
    row = conn.execute(
        "SELECT id FROM treadle.jobs WHERE workflow_run_id = %s AND step = %s AND state = 'available'", [run_id, step]
    ).fetchone()
    assert row is not None, f"run {run_id} has no step {step} waiting"
    return int(row[0])


def state_of(conn: psycopg.Connection[Any], run_id: int) -> str:
    row = conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return str(row[0])


@contextmanager
def listening(dsn: str, queue: str) -> Iterator[psycopg.Connection[Any]]:
    """A SQL session waiting for finishes on `queue`: registered, then listening."""
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("SELECT treadle.listen_done(%s)", [queue])
        listener.execute("LISTEN treadle_done")
        yield listener


def heard(listener: psycopg.Connection[Any], queue: str) -> bool:
    return any(n.payload == queue for n in listener.notifies(timeout=HEARD_WITHIN, stop_after=1))


def ends_heard(
    dsn: str, conn: psycopg.Connection[Any], run_id: int, end: Callable[[], None], name: str, ended: str
) -> Any:
    """Wait on the run two ways, end it with `end`, and return what wait_workflow returned."""
    waiter = Background(lambda: treadle.wait_workflow(with_app_name(dsn, name), run_id, poll_interval=HOUR))
    until_run_read(conn, backend_of(conn, name))
    with listening(dsn, QUEUE) as listener:
        end()
        assert state_of(conn, run_id) == ended
        assert heard(listener, QUEUE), "the run ended, and its queue's waiting session heard nothing"
    waiter.thread.join(HEARD_WITHIN)
    assert not waiter.thread.is_alive(), "the run ended, and wait_workflow was never woken"
    return waiter.outcome()


def test_cancel_workflow_that_cancels_a_waiting_step(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn, ["a", "b"])

    def end() -> None:
        assert conn.execute("SELECT treadle.cancel_workflow(%s)", [run_id]).fetchone() == (True,)

    with pytest.raises(treadle.WorkflowCancelled):
        ends_heard(dsn, conn, run_id, end, "ends-cancel", "cancelled")


def test_cancel_workflow_of_a_run_that_only_sleeps(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn, ["nap", "b"], after={"b": ["nap"]}, sleeps={"nap": "1 hour"})

    def end() -> None:
        assert conn.execute("SELECT treadle.cancel_workflow(%s)", [run_id]).fetchone() == (True,)

    with pytest.raises(treadle.WorkflowCancelled):
        ends_heard(dsn, conn, run_id, end, "ends-cancel-sleep", "cancelled")


def test_cancel_run_with_compensate_and_nothing_to_undo(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn, ["a", "b"], compensations={"a": "undo_a"})

    def end() -> None:
        row = conn.execute("SELECT treadle.cancel_run(%s, compensate => true)", [run_id]).fetchone()
        assert row == ("compensated",)

    with pytest.raises(treadle.WorkflowFailed):
        ends_heard(dsn, conn, run_id, end, "ends-cancel-run", "compensated")


def rescue_later(conn: psycopg.Connection[Any], by: timedelta) -> None:
    """treadle.rescue with treadle's clock (this session's) moved on by `by`."""
    moved = conn.execute("SELECT statement_timestamp() + %s", [by]).fetchone()
    assert moved is not None
    conn.execute("SELECT set_config('treadle.now', %s, false)", [moved[0].isoformat()])
    try:
        conn.execute("SELECT treadle.rescue()")
    finally:
        conn.execute("RESET treadle.now")


def test_a_sleep_that_ends_in_rescue_and_completes_the_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn, ["nap"], after={}, sleeps={"nap": "1 minute"})
    results = ends_heard(dsn, conn, run_id, lambda: rescue_later(conn, timedelta(minutes=2)), "ends-nap", "completed")
    assert list(results) == ["nap"]


def test_a_signal_wait_that_times_out_in_rescue_and_fails_the_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn, ["w"], after={}, waits={"w": {"signal": "go", "timeout": "1 minute"}})
    with pytest.raises(treadle.WorkflowFailed):
        ends_heard(dsn, conn, run_id, lambda: rescue_later(conn, timedelta(minutes=2)), "ends-timeout", "failed")


def test_a_signal_wait_that_times_out_and_continues_to_the_runs_end(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(
        conn, ["w"], after={}, waits={"w": {"signal": "go", "timeout": "1 minute", "on_timeout": "continue"}}
    )
    results = ends_heard(
        dsn, conn, run_id, lambda: rescue_later(conn, timedelta(minutes=2)), "ends-continue", "completed"
    )
    assert results == {"w": {"timed_out": True}}


def test_a_signal_that_completes_the_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn, ["w"], after={}, waits={"w": {"signal": "go"}})

    def end() -> None:
        row = conn.execute("SELECT treadle.signal(%s, 'go', %s)", [run_id, Jsonb({"ok": 1})]).fetchone()
        assert row == ("delivered",)

    assert ends_heard(dsn, conn, run_id, end, "ends-signal", "completed") == {"w": {"ok": 1}}


def test_the_last_attempt_of_a_step_in_a_queue_of_its_own_fails_the_run(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(conn, ["a"], step_options={"a": {"queue": ELSEWHERE, "max_attempts": 1}})
    step = job_of(conn, run_id, "a")

    def end() -> None:
        assert sql_worker.fail(step, "boom") == "discarded"

    with pytest.raises(treadle.WorkflowFailed):
        ends_heard(dsn, conn, run_id, end, "ends-fail", "failed")


def test_the_last_step_in_a_queue_of_its_own_completes_the_run(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(conn, ["a"], step_options={"a": {"queue": ELSEWHERE}})
    step = job_of(conn, run_id, "a")
    results = ends_heard(dsn, conn, run_id, lambda: sql_worker.complete(step, {"n": 1}), "ends-last", "completed")
    assert results == {"a": {"n": 1}}


def test_a_compensation_in_a_queue_of_its_own_ends_the_run(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = start(
        conn,
        ["a", "b"],
        compensations={"a": "undo_a"},
        step_options={"b": {"max_attempts": 1}, "undo_a": {"queue": ELSEWHERE}},
    )
    sql_worker.complete(job_of(conn, run_id, "a"), {"held": 1})
    assert sql_worker.fail(job_of(conn, run_id, "b"), "boom") == "discarded"
    assert state_of(conn, run_id) == "compensating"
    undo = job_of(conn, run_id, "undo_a")
    with pytest.raises(treadle.WorkflowFailed):
        ends_heard(dsn, conn, run_id, lambda: sql_worker.complete(undo), "ends-compensated", "compensated")


def test_a_child_run_in_another_queue_that_completes_its_parent(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    conn.execute("SELECT treadle.define_workflow('ends-kid', array['k'])")
    run_id = start(conn, ["kid"], after={}, children={"kid": {"workflow": "ends-kid", "queue": ELSEWHERE}})
    row = conn.execute("SELECT id FROM treadle.workflow_runs WHERE parent_run_id = %s", [run_id]).fetchone()
    assert row is not None
    step = job_of(conn, int(row[0]), "k")
    results = ends_heard(dsn, conn, run_id, lambda: sql_worker.complete(step, {"k": 1}), "ends-child", "completed")
    assert results == {"kid": {"k": {"k": 1}}}


def fail_for_good(sql_worker: SqlWorker, job_id: int) -> None:
    token = sql_worker.claim(job_id)
    row = sql_worker.conn.execute("SELECT treadle.fail(%s, %s, 'boom', retryable => false)", [job_id, token]).fetchone()
    assert row == ("discarded",)


def test_a_grandchild_that_ends_after_its_failed_ancestors(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    # the root and its child fail while the grandchild still runs: wait_workflow on the
    # root waits for the grandchild (children_running), whose end moves no run of the
    # root's queue (its parent has failed already)
    conn.execute("SELECT treadle.define_workflow('ends-grandkid', array['g'])")
    conn.execute(
        "SELECT treadle.define_workflow('ends-kid2', array['c', 'gk'], after => '{}', children => %s)",
        [Jsonb({"gk": {"workflow": "ends-grandkid", "queue": "ends-third"}})],
    )
    run_id = start(conn, ["a", "kid"], after={}, children={"kid": {"workflow": "ends-kid2", "queue": ELSEWHERE}})
    child = conn.execute("SELECT id FROM treadle.workflow_runs WHERE parent_run_id = %s", [run_id]).fetchone()
    assert child is not None
    grandchild = conn.execute("SELECT id FROM treadle.workflow_runs WHERE parent_run_id = %s", [child[0]]).fetchone()
    assert grandchild is not None
    fail_for_good(sql_worker, job_of(conn, run_id, "a"))
    fail_for_good(sql_worker, job_of(conn, int(child[0]), "c"))
    assert state_of(conn, run_id) == "failed" and state_of(conn, int(child[0])) == "failed"
    step = job_of(conn, int(grandchild[0]), "g")
    with pytest.raises(treadle.WorkflowFailed):
        ends_heard(dsn, conn, run_id, lambda: sql_worker.complete(step, {"g": 1}), "ends-grandchild", "failed")
