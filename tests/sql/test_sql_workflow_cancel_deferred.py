"""A step whose end cancels its run while another session holds a job of the run's tree: its
finish does not wait, and the run's cancel is left for a re-check (treadle._cancel_later,
073_workflow_cancel_rechecks.sql). These tests make that window by hand (a session holds the
sibling step's job row, as a finish of it would) and check what each path does inside it and
after it: the run is cancelled once, by rescue when no claim comes (a paused queue), by a
complete_and_claim that claims a sibling (which then gets a cancel request, and whose result
does not complete the run), and with cancel_run(compensate => true) inside the window, whose
compensation runs once, after the run's last step ended."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, value

QUEUE = "cancel-deferred"


def claim(conn: psycopg.Connection, batch: int = 50) -> dict[str, tuple[int, Any]]:
    """Claim step jobs of the queue: step -> (job id, lease token)."""
    rows = conn.execute(
        "select step, id, lease_token from treadle.claim('w', array[%s], batch => %s)", (QUEUE, batch)
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def defer_cancel(connect: Connect, setup: psycopg.Connection, run: int, jobs: dict[str, tuple[int, Any]]) -> None:
    """a ends cancelled while another session holds b's job: the run's cancel is left for later."""
    assert value(setup, "select treadle.cancel(%s)", (jobs["a"][0],)) is True
    holder = connect(autocommit=False)
    holder.execute("select 1 from treadle.jobs where id = %s for update", (jobs["b"][0],))
    finisher = connect(autocommit=False)
    finisher.execute("set lock_timeout = '5s'")  # (a finish that waited would fail here)
    assert value(finisher, "select treadle.complete(%s, %s)", jobs["a"]) == "cancelled"
    finisher.commit()
    holder.rollback()
    assert value(setup, "select count(*) from treadle.run_rechecks where run_id = %s", (run,)) == 1
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "running"


def states(conn: psycopg.Connection, run: int) -> list[tuple[str, str, bool]]:
    rows = conn.execute(
        "select step, state, cancel_requested from treadle.jobs where workflow_run_id = %s order by step, id", (run,)
    ).fetchall()
    return [(s, st, c) for s, st, c in rows]


def test_rescue_cancels_the_run_of_a_paused_queue_that_no_one_claims(connect: Connect) -> None:
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('fan', steps => array['a', 'b', 'c'], queue => %s, after => %s)",
        (QUEUE, Jsonb({"a": [], "b": [], "c": ["a", "b"]})),
    )
    jobs = claim(setup)
    defer_cancel(connect, setup, run, jobs)
    setup.execute("select treadle.pause(%s)", (QUEUE,))
    # a paused queue's claims take nothing, but they (and rescue) still move its re-checks
    assert claim(setup) == {}
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "cancelled"
    assert value(setup, "select count(*) from treadle.run_rechecks") == 0
    assert states(setup, run) == [("a", "cancelled", True), ("b", "running", True)]


def test_rescue_alone_cancels_a_deferred_run(connect: Connect) -> None:
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('fan', steps => array['a', 'b', 'c'], queue => %s, after => %s)",
        (QUEUE, Jsonb({"a": [], "b": [], "c": ["a", "b"]})),
    )
    jobs = claim(setup)
    defer_cancel(connect, setup, run, jobs)
    # b completes inside the window: the run does not move past a (c needs a's result)
    assert value(setup, "select treadle.complete(%s, %s)", jobs["b"]) == "completed"
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "running"
    # every step has ended, the run is running until the re-check: a waiter sees `running`
    setup.execute("select treadle.rescue()")
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "cancelled"
    assert value(setup, "select count(*) from treadle.run_rechecks") == 0
    assert states(setup, run) == [("a", "cancelled", True), ("b", "completed", False)]
    # a second rescue, and a retry of the run afterwards, are not touched by the spent re-check
    assert value(setup, "select treadle.retry_run(%s)", (run,)) == "running"
    setup.execute("select treadle.rescue()")
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "running"


def test_complete_and_claim_claims_a_sibling_of_a_run_whose_cancel_is_deferred(connect: Connect) -> None:
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('fan', steps => array['a', 'b', 's'], queue => %s, after => %s)",
        (QUEUE, Jsonb({"a": [], "b": [], "s": []})),
    )
    jobs = claim(setup, batch=2)
    assert set(jobs) == {"a", "b"}
    defer_cancel(connect, setup, run, jobs)
    # b's finish claims s in the same statement; the re-checks move at its end
    rows = setup.execute(
        "select finished_state, (job).step, (job).id, (job).lease_token from treadle.complete_and_claim("
        " array[%s]::bigint[], array[%s]::uuid[], array[null]::jsonb[], 'w', array[%s], batch => 5)",
        (jobs["b"][0], jobs["b"][1], QUEUE),
    ).fetchall()
    claimed = [(r[1], r[2], r[3]) for r in rows if r[1] is not None]
    assert [c[0] for c in claimed] == ["s"], rows
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "cancelled"
    # the sibling it claimed has its cancel requested, and its result does not complete the run
    assert states(setup, run) == [("a", "cancelled", True), ("b", "completed", False), ("s", "running", True)]
    assert value(setup, "select treadle.complete(%s, %s, %s)", (claimed[0][1], claimed[0][2], Jsonb(1))) == (
        "cancelled"
    )
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "cancelled"
    assert value(setup, "select results from treadle.workflow_runs where id = %s", (run,)) == {"b": None}


def test_cancel_run_with_compensations_inside_the_window(connect: Connect) -> None:
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('comp', steps => array['x', 'a', 'b'], queue => %s, after => %s,"
        " compensations => %s)",
        (QUEUE, Jsonb({"x": [], "a": ["x"], "b": ["x"]}), Jsonb({"x": "ux"})),
    )
    x = claim(setup)["x"]
    assert value(setup, "select treadle.complete(%s, %s)", x) == "completed"
    jobs = claim(setup)
    assert set(jobs) == {"a", "b"}
    defer_cancel(connect, setup, run, jobs)
    # the operator cancels and compensates while the step's cancel waits for its re-check
    assert value(setup, "select treadle.cancel_run(%s, compensate => true)", (run,)) == "compensating"
    setup.execute("select treadle.rescue()")  # the re-check: the run is not cancelled again
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "compensating"
    assert value(setup, "select count(*) from treadle.run_rechecks") == 0
    # b was asked to stop; when it ends, the one compensation starts
    assert value(setup, "select treadle.complete(%s, %s)", jobs["b"]) == "cancelled"
    comp = claim(setup)
    assert list(comp) == ["ux"]
    assert value(setup, "select treadle.complete(%s, %s)", comp["ux"]) == "completed"
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "compensated"
    assert [s for s in states(setup, run) if s[0] == "ux"] == [("ux", "completed", False)]


def test_explain_run_names_the_cancel_left_for_a_re_check(connect: Connect) -> None:
    """Inside the window the run is running, a cancelled, c waiting for a: explain_run said only
    that, as if c would run; it names the re-check, the queue whose claim does it, and when."""
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('fan', steps => array['a', 'b', 'c'], queue => %s, after => %s)",
        (QUEUE, Jsonb({"a": [], "b": [], "c": ["a", "b"]})),
    )
    jobs = claim(setup)
    defer_cancel(connect, setup, run, jobs)
    rows = setup.execute(
        "select step, job_id, reason, message, at = (select added_at from treadle.run_rechecks where run_id = %s)"
        " from treadle.explain_run(%s) where reason = 'recheck'",
        (run, run),
    ).fetchall()
    assert rows == [
        (
            "a",
            jobs["a"][0],
            "recheck",
            "step a cancelled: the run's cancel is left for a re-check, done by the next claim on queue"
            f" {QUEUE} or treadle.rescue",
            True,
        )
    ]
    setup.execute("select treadle.rescue()")
    assert value(setup, "select count(*) from treadle.explain_run(%s) where reason = 'recheck'", (run,)) == 0
