"""treadle._lock_run_tree_jobs reads a run tree again after each change made under it, at
most 100 times (053_workflow_lock_order.sql): cancel_workflow on a tree that keeps changing
stops with 40001 and changes nothing, instead of waiting for ever.

The tree is changed on purpose, the same way each time: two sessions take turns. One holds
the newest step job of the run, on which the cancel's read waits; meanwhile the other adds
a step job to the run, commits it, and takes its lock; then the first lets go. The cancel's
read ends, finds a job it did not hold, and reads again: there it waits for the new job.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect, value

QUEUE = "tree-cap"
READS = 100  # the cap


def add_step(conn: psycopg.Connection, run_id: int, n: int) -> int:
    job_id: int = value(
        conn,
        "insert into treadle.jobs (queue, name, args, run_at, created_at, workflow_run_id, step) "
        "values (%s, 'workflow:cap/a', '{}', now(), now(), %s, 'a') returning id",
        (QUEUE, run_id),
    )
    return job_id


def blocked_by(watcher: psycopg.Connection, pid: int, holder: int, done: threading.Event) -> bool:
    """Wait until backend pid waits for holder's lock; false when the cancel ended first."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if done.is_set():
            return False
        if value(watcher, "select %s = any(pg_blocking_pids(%s))", (holder, pid)):
            return True
        time.sleep(0.005)
    raise AssertionError(f"backend {pid} never waited for {holder}")


def test_cancel_workflow_on_a_tree_that_keeps_changing_stops_with_40001(connect: Connect) -> None:
    setup = connect()
    run_id: int = value(setup, "select treadle.start_workflow('cap', '{}', steps => array['a'], queue => %s)", (QUEUE,))
    first: int = value(setup, "select id from treadle.jobs where workflow_run_id = %s", (run_id,))
    turns = [connect(autocommit=False), connect(autocommit=False)]
    pids = [value(t, "select pg_backend_pid()") for t in turns]
    turns[0].execute("select 1 from treadle.jobs where id = %s for update", (first,))

    canceller = connect()
    canceller_pid = value(canceller, "select pg_backend_pid()")
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def cancel() -> None:
        try:
            outcome["result"] = value(canceller, "select treadle.cancel_workflow(%s)", (run_id,))
        except psycopg.Error as error:
            outcome["error"] = error
        finally:
            done.set()

    thread = threading.Thread(target=cancel, daemon=True)
    thread.start()
    added = [first]
    turn = 0
    for n in range(READS + 5):
        if not blocked_by(setup, canceller_pid, pids[turn], done):
            break
        other = turns[1 - turn]
        added.append(add_step(setup, run_id, n))  # committed: the next read finds it
        other.execute("select 1 from treadle.jobs where id = %s for update", (added[-1],))
        turns[turn].rollback()  # the read under way ends, and the next waits for `other`
        turn = 1 - turn
    for t in turns:
        t.rollback()  # (without a cap the cancel ends here, having waited the changes out)
    thread.join(60)
    assert not thread.is_alive()

    error = outcome.get("error")
    assert isinstance(error, psycopg.errors.SerializationFailure), outcome
    assert "changed 100 times" in str(error)
    # nothing changed: the run runs, and none of its steps was cancelled
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "running"
    assert value(
        setup, "select count(*) from treadle.jobs where workflow_run_id = %s and state = 'available'", (run_id,)
    ) == len(added)
    # once the tree stops changing, the cancel is done
    assert value(setup, "select treadle.cancel_workflow(%s)", (run_id,)) is True
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "cancelled"


def test_a_few_changes_under_the_lock_are_read_again(connect: Connect) -> None:
    changes = 3
    # below the cap the cancel waits them out, and cancels every step added meanwhile
    setup = connect()
    run_id: int = value(setup, "select treadle.start_workflow('cap', '{}', steps => array['a'], queue => %s)", (QUEUE,))
    first: int = value(setup, "select id from treadle.jobs where workflow_run_id = %s", (run_id,))
    turns = [connect(autocommit=False), connect(autocommit=False)]
    pids = [value(t, "select pg_backend_pid()") for t in turns]
    turns[0].execute("select 1 from treadle.jobs where id = %s for update", (first,))
    canceller = connect()
    canceller_pid = value(canceller, "select pg_backend_pid()")
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def cancel() -> None:
        try:
            outcome["result"] = value(canceller, "select treadle.cancel_workflow(%s)", (run_id,))
        finally:
            done.set()

    thread = threading.Thread(target=cancel, daemon=True)
    thread.start()
    turn = 0
    for n in range(changes):
        assert blocked_by(setup, canceller_pid, pids[turn], done)
        other = turns[1 - turn]
        job_id = add_step(setup, run_id, n)
        other.execute("select 1 from treadle.jobs where id = %s for update", (job_id,))
        turns[turn].rollback()
        turn = 1 - turn
    turns[turn].rollback()
    thread.join(60)
    assert not thread.is_alive() and outcome == {"result": True}
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "cancelled"
    assert (
        value(setup, "select count(*) from treadle.jobs where workflow_run_id = %s and state <> 'cancelled'", (run_id,))
        == 0
    )
