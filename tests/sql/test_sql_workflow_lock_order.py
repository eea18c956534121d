"""Sessions that lock many rows of workflows at once keep one order (053_workflow_lock_order.sql):
step jobs first, then runs, a child run before its parent. Each test steps two or three
transactions by hand into the interleaving that deadlocked (40P01) when a batch's finish
locked parent runs in the order of its rows, cancel_workflow locked a parent run before a
child's step job, and a step whose end cancels its run locked the run before a sibling's job;
now every session ends, and the runs end as one at a time would leave them."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest

from tests.sql.sqlcalls import Connect, WaitBlocked, value

QUEUE = "lock-order"
PARENT = "select treadle.start_workflow(%s, steps => %s, queue => 'lock-order', after => %s, children => %s)"


def in_thread(conn: psycopg.Connection, sql: str, params: tuple[Any, ...]) -> tuple[threading.Thread, list[Any]]:
    """Run sql on conn (not autocommit) and commit, in a thread; its rows, or the error it raised."""
    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append(conn.execute(sql, params).fetchall())
            conn.commit()
        except psycopg.Error as error:  # a deadlock lands here
            conn.rollback()
            answer.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answer


def claim(conn: psycopg.Connection) -> dict[tuple[int, str], tuple[int, Any]]:
    """Claim every step job there is: (run id, step) -> (job id, lease token)."""
    rows = conn.execute(
        "select workflow_run_id, step, id, lease_token from treadle.claim('w', array['lock-order'], batch => 50)"
    ).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def child(conn: psycopg.Connection, parent: int, step: str) -> int:
    return int(
        value(
            conn, "select id from treadle.workflow_runs where parent_run_id = %s and parent_step = %s", (parent, step)
        )
    )


def complete_many(jobs: list[tuple[int, Any]]) -> tuple[str, tuple[Any, ...]]:
    return "select state from treadle.complete_many(%s, %s)", ([j[0] for j in jobs], [j[1] for j in jobs])


def test_two_batches_whose_children_end_move_two_parents_in_opposite_orders(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    setup = connect()
    setup.execute("select treadle.define_workflow('kid', array['k'])")
    kids = json.dumps({"c1": {"workflow": "kid"}, "c2": {"workflow": "kid"}})
    # p's second child starts after p0, so its job comes after q's children's: the batches'
    # rows (in job id order) reach p then q, and q then p
    p = value(setup, PARENT, ("par1", ["p0", "c1", "c2"], json.dumps({"p0": [], "c1": [], "c2": ["p0"]}), kids))
    q = value(setup, PARENT, ("par2", ["c1", "c2"], json.dumps({"c1": [], "c2": []}), kids))
    jobs = claim(setup)
    assert value(setup, "select treadle.complete(%s, %s)", jobs[(p, "p0")]) == "completed"
    jobs |= claim(setup)
    p1, p2, q1, q2 = child(setup, p, "c1"), child(setup, p, "c2"), child(setup, q, "c1"), child(setup, q, "c2")
    assert jobs[(p1, "k")][0] < jobs[(q1, "k")][0] < jobs[(q2, "k")][0] < jobs[(p2, "k")][0]

    holder, a, b = connect(autocommit=False), connect(autocommit=False), connect(autocommit=False)
    # a third session holds q's first child's run row (as a signal to it would), so batch a
    # stops there: before, it held p (its first row's child ended) and waited for q1
    holder.execute("select 1 from treadle.workflow_runs where id = %s for update", (q1,))
    thread_a, answer_a = in_thread(a, *complete_many([jobs[(p1, "k")], jobs[(q1, "k")]]))
    wait_until_blocked(a.info.backend_pid)
    # batch b: q's second child ends (q), then p's second child (p)
    thread_b, answer_b = in_thread(b, *complete_many([jobs[(q2, "k")], jobs[(p2, "k")]]))
    thread_b.join(5)
    if thread_b.is_alive():
        wait_until_blocked(b.info.backend_pid)
    holder.commit()
    thread_a.join(60)
    thread_b.join(60)
    assert answer_a == [[("completed",), ("completed",)]], answer_a
    assert answer_b == [[("completed",), ("completed",)]], answer_b
    assert setup.execute(
        "select id, state from treadle.workflow_runs where id = any(%s) order by id", ([p, q],)
    ).fetchall() == [(p, "completed"), (q, "completed")]


def test_cancel_workflow_while_a_batch_ends_a_child_of_the_run(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    setup = connect()
    setup.execute("select treadle.define_workflow('kid', array['k'])")
    kids = json.dumps({"c1": {"workflow": "kid"}, "c2": {"workflow": "kid"}})
    p = value(
        setup,
        PARENT,
        ("par", ["p1", "c1", "c2", "p2"], json.dumps({"p1": [], "c1": [], "c2": [], "p2": ["c1", "c2"]}), kids),
    )
    other = value(setup, "select treadle.start_workflow('lin', steps => array['a', 'b'], queue => 'lock-order')")
    jobs = claim(setup)
    c2 = child(setup, p, "c2")
    # p1 waits again (its cancel cancels it, and with it p, at once); c1's step runs on
    setup.execute("select treadle.release(%s, %s)", jobs[(p, "p1")])

    worker, canceller = connect(autocommit=False), connect(autocommit=False)
    # the worker's batch has locked its jobs (as complete_many's UPDATE does first): c2's
    # last step, and another run's step
    batch = [jobs[(c2, "k")], jobs[(other, "a")]]
    worker.execute("select 1 from treadle.jobs where id = any(%s) order by id for update", ([j[0] for j in batch],))
    # the cancel waits for c2's job; before, it held p by then (p1's cancel cancelled p)
    thread_c, answer_c = in_thread(canceller, "select treadle.cancel_workflow(%s)", (p,))
    wait_until_blocked(canceller.info.backend_pid)
    # the batch's finish: c2 completes, and moves p (locked after c2)
    thread_w, answer_w = in_thread(worker, *complete_many(batch))
    thread_w.join(60)
    thread_c.join(60)
    assert answer_w == [[("completed",), ("completed",)]], answer_w
    assert answer_c == [[(True,)]], answer_c
    runs: dict[int, str] = dict(
        setup.execute("select id, state from treadle.workflow_runs where id = any(%s)", ([p, c2, other],)).fetchall()
    )
    assert runs == {p: "cancelled", c2: "completed", other: "running"}
    assert value(setup, "select results from treadle.workflow_runs where id = %s", (p,)) == {"c2": {"k": None}}
    # c1's step runs on, its cancel requested; p1 was cancelled; no p2
    assert setup.execute(
        "select step, state, cancel_requested from treadle.jobs where workflow_run_id = any(%s) order by step",
        ([p, child(setup, p, "c1")],),
    ).fetchall() == [("k", "running", True), ("p1", "cancelled", False)]


@pytest.mark.parametrize("batch", [False, True], ids=["alone", "in-a-batch"])
def test_a_step_ending_cancelled_while_a_sibling_step_finishes(connect: Connect, batch: bool) -> None:
    setup = connect()
    run = value(setup, PARENT, ("fan3", ["a", "b", "c"], json.dumps({"a": [], "b": [], "c": []}), None))
    other, third = (
        value(setup, "select treadle.start_workflow('lin2', steps => array['x', 'y'], queue => 'lock-order')")
        for _ in range(2)
    )
    jobs = claim(setup)
    # b waits again (the cancel cancels it, and with it the run); a's cancel is requested
    setup.execute("select treadle.release(%s, %s)", jobs[(run, "b")])
    assert value(setup, "select treadle.cancel(%s)", (jobs[(run, "a")][0],)) is True

    stopper, sibling = connect(autocommit=False), connect(autocommit=False)
    # the sibling's batch has locked its jobs (c's, and another run's step)
    sibling_batch = [jobs[(run, "c")], jobs[(other, "x")]]
    sibling.execute("select 1 from treadle.jobs where id = any(%s) for update", ([j[0] for j in sibling_batch],))
    # a ends cancelled: its run's other steps stop, but c's job is held: the finish, which
    # holds a's job, waits for none (another session may wait for a's), and leaves the run's
    # cancel for a re-check (073_workflow_cancel_rechecks.sql); before, it waited for c's job,
    # and the run was locked by then (b's cancel cancelled it, or the batch locked its runs)
    stopper_batch = [jobs[(run, "a")]] + [jobs[(third, "x")]] * batch
    thread_s, answer_s = in_thread(stopper, *complete_many(stopper_batch))
    thread_s.join(60)
    assert answer_s == [[("cancelled",)] + [("completed",)] * batch], answer_s
    assert value(setup, "select count(*) from treadle.run_rechecks where run_id = %s", (run,)) == 1
    thread_c, answer_c = in_thread(sibling, *complete_many(sibling_batch))
    thread_c.join(60)
    assert answer_c == [[("completed",), ("completed",)]], answer_c
    # the next claim on the queue (its re-checks' move, first) cancels the run, b with it
    assert value(setup, "select treadle._move_rechecks(array['lock-order'])") == 1
    assert value(setup, "select count(*) from treadle.run_rechecks where run_id = %s", (run,)) == 0
    assert setup.execute(
        "select step, state from treadle.jobs where workflow_run_id = %s order by step", (run,)
    ).fetchall() == [("a", "cancelled"), ("b", "cancelled"), ("c", "completed")]
    assert setup.execute("select state, results from treadle.workflow_runs where id = %s", (run,)).fetchone() == (
        "cancelled",
        {"c": None},
    )


def test_a_batch_with_a_graph_step_that_makes_no_join_ready_while_its_run_fails_and_moves_the_parent(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    """A batch's completed graph step whose successors wait for it alone records its result with
    an UPDATE that waits for the run row (no re-check), so its run is locked up front with the
    others: before, the batch held the child run's parent (an ancestor, locked up front) and then
    waited for the child run, which a failing sibling step held while it waited for the parent."""
    setup = connect()
    setup.execute(
        "select treadle.define_workflow('kid2', array['a', 'c', 'b'], after => %s)",
        (json.dumps({"a": [], "c": [], "b": ["a"]}),),
    )
    other = value(setup, "select treadle.start_workflow('lin', steps => array['s1', 's2'], queue => 'lock-order')")
    q = value(setup, PARENT, ("par", ["k"], json.dumps({"k": []}), json.dumps({"k": {"workflow": "kid2"}})))
    r = child(setup, q, "k")
    assert other < q < r
    jobs = claim(setup)

    holder, a, b = connect(autocommit=False), connect(autocommit=False), connect(autocommit=False)
    # a third session holds the other run's row, so the batch stops there, holding q already
    # (run ids descending); before, it held q and not r
    holder.execute("select 1 from treadle.workflow_runs where id = %s for update", (other,))
    thread_a, answer_a = in_thread(a, *complete_many([jobs[(other, "s1")], jobs[(r, "a")]]))
    wait_until_blocked(a.info.backend_pid)
    # c fails for good: r fails (its row locked), and its end moves q
    thread_b, answer_b = in_thread(b, "select treadle.fail(%s, %s, 'boom', retryable => false)", (*jobs[(r, "c")],))
    thread_b.join(5)
    if thread_b.is_alive():
        wait_until_blocked(b.info.backend_pid)
    holder.commit()
    thread_a.join(60)
    thread_b.join(60)
    assert answer_a == [[("completed",), ("completed",)]], answer_a
    assert answer_b == [[("discarded",)]], answer_b
    runs: dict[int, str] = dict(
        setup.execute("select id, state from treadle.workflow_runs where id = any(%s)", ([other, q, r],)).fetchall()
    )
    assert runs == {other: "running", q: "failed", r: "failed"}, runs
