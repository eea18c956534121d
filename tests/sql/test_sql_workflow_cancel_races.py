"""A run's cancel racing the paths that move a run without a step job of their own to lock
first: a re-check's move (073_workflow_rechecks.sql), a signal, a sleep's end. Each test steps
the transactions by hand (a third session holds a run row; pg_stat_activity tells when a
session waits) into the interleaving that deadlocked (40P01) or left a cancelled run with a
live job, when treadle.cancel_workflow locked a parent run before its child's (cancelling a
parent's waiting step locks the parent) or read the run's steps before locking its row; now
cancel_workflow locks the tree's runs after its jobs, a child before its parent
(treadle._lock_run_tree_jobs, 053_workflow_lock_order.sql)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, WaitBlocked, value

QUEUE = "cancel-race"


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
        "select workflow_run_id, step, id, lease_token from treadle.claim('w', array[%s], batch => 50)", (QUEUE,)
    ).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def hold(conn: psycopg.Connection, run_id: int) -> None:
    conn.execute("select 1 from treadle.workflow_runs where id = %s for update", (run_id,))


def live_jobs(conn: psycopg.Connection, run_id: int) -> list[tuple[str, str, bool]]:
    rows = conn.execute(
        "select step, state, cancel_requested from treadle.jobs where workflow_run_id = %s"
        " and state = any(array['available', 'retryable', 'running', 'blocked']) order by step",
        (run_id,),
    ).fetchall()
    return [(s, st, c) for s, st, c in rows]


def test_a_recheck_that_ends_a_child_run_while_its_parent_is_cancelled(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    """The cancel waits for the parent, which a third session holds, when the re-check's move
    starts: before, the cancel held its jobs only, so the move locked the child run, ended it,
    and waited for the parent, which the cancel then locked (its waiting step's cancel) before
    it waited for the child run: 40P01. Now the cancel holds the child run by then."""
    setup = connect()
    # the child: x's result is [], so the map m (after x and y) completes at once, and the
    # child with it, when y's re-check moves it
    setup.execute(
        "select treadle.define_workflow('kid', array['x', 'y', 'm'], after => %s, maps => %s)",
        (Jsonb({"x": [], "y": [], "m": ["x", "y"]}), Jsonb({"m": "x"})),
    )
    parent = value(
        setup,
        "select treadle.start_workflow('par', steps => array['p1', 'c'], queue => %s, after => %s, children => %s)",
        (QUEUE, Jsonb({"p1": [], "c": []}), Jsonb({"c": {"workflow": "kid"}})),
    )
    kid = value(setup, "select id from treadle.workflow_runs where parent_run_id = %s", (parent,))
    jobs = claim(setup)
    setup.execute("select treadle.release(%s, %s)", jobs[(parent, "p1")])  # p1 waits: its cancel locks the parent
    assert value(setup, "select treadle.complete(%s, %s, '[]')", jobs[(kid, "x")]) == "completed"
    # y completes while another session holds the child run: left for a re-check
    holder = connect(autocommit=False)
    hold(holder, kid)
    assert value(setup, "select treadle.complete(%s, %s)", jobs[(kid, "y")]) == "completed"
    assert value(setup, "select count(*) from treadle.run_rechecks where run_id = %s", (kid,)) == 1
    holder.commit()

    # a third session holds the parent: the cancel waits for it (its jobs locked), and so
    # does the re-check's move, after it locked and ended the child
    canceller, mover = connect(autocommit=False), connect(autocommit=False)
    hold(holder, parent)
    thread_c, answer_c = in_thread(canceller, "select treadle.cancel_workflow(%s)", (parent,))
    wait_until_blocked(canceller.info.backend_pid)
    thread_m, answer_m = in_thread(mover, "select treadle._move_rechecks(array[%s])", (QUEUE,))
    thread_m.join(5)
    if thread_m.is_alive():
        wait_until_blocked(mover.info.backend_pid)
    holder.commit()
    thread_c.join(60)
    thread_m.join(60)
    assert answer_c == [[(True,)]], answer_c
    # the cancel held the child run by then (child before parent): the re-check waits for the next
    assert answer_m == [[(0,)]], answer_m
    runs: dict[int, str] = dict(
        setup.execute("select id, state from treadle.workflow_runs where id = any(%s)", ([parent, kid],))
    )
    assert runs == {parent: "cancelled", kid: "cancelled"}, runs
    # which records y's result on the cancelled child (for a retry), and moves nothing else
    assert value(setup, "select treadle._move_rechecks(array[%s])", (QUEUE,)) == 1
    assert value(setup, "select results from treadle.workflow_runs where id = %s", (kid,)) == {"x": [], "y": None}
    assert (
        dict(setup.execute("select id, state from treadle.workflow_runs where id = any(%s)", ([parent, kid],))) == runs
    )
    assert live_jobs(setup, parent) == [] and live_jobs(setup, kid) == []


def test_a_signal_that_starts_a_step_while_the_run_is_cancelled(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    """The signal's transaction holds the run and has enqueued the step after the wait; the
    cancel read the run's steps before it: it requested the running step's cancel and left
    the new step available, a live job of a run whose cancel was asked for."""
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('sig', steps => array['a', 'w', 'b'], queue => %s, after => %s, waits => %s)",
        (QUEUE, Jsonb({"a": [], "w": [], "b": ["w"]}), Jsonb({"w": {"signal": "go"}})),
    )
    claim(setup)  # a runs
    sender, canceller = connect(autocommit=False), connect(autocommit=False)
    assert value(sender, "select treadle.signal(%s, 'go')", (run,)) == "delivered"  # b enqueued, uncommitted
    thread_c, answer_c = in_thread(canceller, "select treadle.cancel_workflow(%s)", (run,))
    wait_until_blocked(canceller.info.backend_pid)
    sender.commit()
    thread_c.join(60)
    assert answer_c == [[(True,)]], answer_c
    # b was cancelled with the run, never left to start; a runs on, its cancel requested
    assert live_jobs(setup, run) == [("a", "running", True)]
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "cancelled"
    assert claim(setup) == {}


def test_a_sleep_that_ends_while_the_run_is_cancelled(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    """As a signal: the sleep's end (treadle.rescue) holds the run and has enqueued the step
    after it while the cancel runs."""
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('nap', steps => array['a', 's', 'b'], queue => %s, after => %s, sleeps => %s)",
        (QUEUE, Jsonb({"a": [], "s": [], "b": ["s"]}), Jsonb({"s": "1 second"})),
    )
    claim(setup)  # a runs
    waker, canceller = connect(autocommit=False), connect(autocommit=False)
    # the sleep is due: its end moves the run, uncommitted
    waker.execute(
        "update treadle.workflow_runs set wake_at = now() - interval '1 minute', "
        "wakes = jsonb_build_object('s', now() - interval '1 minute') where id = %s",
        (run,),
    )
    assert value(waker, "select treadle._wake_runs(now())") == 1
    thread_c, answer_c = in_thread(canceller, "select treadle.cancel_workflow(%s)", (run,))
    wait_until_blocked(canceller.info.backend_pid)
    waker.commit()
    thread_c.join(60)
    assert answer_c == [[(True,)]], answer_c
    assert live_jobs(setup, run) == [("a", "running", True)]
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "cancelled"


def test_two_batches_each_with_a_step_that_ends_cancelled_in_the_other_ones_run(connect: Connect) -> None:
    """Batch a finishes a1 (its cancel requested: it ends cancelled, and cancels run r1) and b1;
    batch b finishes b2 (cancels r2) and a2. Each holds its own rows; before, each then waited
    for the jobs under way of the run it cancels (a for a2, b for b1): 40P01. Now a finish that
    holds its rows waits for no other's: a leaves r1's cancel for a re-check, which the next
    claim on the queue moves."""
    setup = connect()
    fan = "select treadle.start_workflow('fan2', steps => array[%s, %s], queue => %s, after => %s)"
    r1 = value(setup, fan, ("a1", "a2", QUEUE, Jsonb({"a1": [], "a2": []})))
    r2 = value(setup, fan, ("b1", "b2", QUEUE, Jsonb({"b1": [], "b2": []})))
    jobs = claim(setup)
    assert value(setup, "select treadle.cancel(%s)", (jobs[(r1, "a1")][0],)) is True
    assert value(setup, "select treadle.cancel(%s)", (jobs[(r2, "b2")][0],)) is True
    a, b = connect(autocommit=False), connect(autocommit=False)
    batch_a, batch_b = [jobs[(r1, "a1")], jobs[(r2, "b1")]], [jobs[(r2, "b2")], jobs[(r1, "a2")]]
    # each batch's rows locked, as its finishing UPDATE locks them first
    for conn, batch in ((a, batch_a), (b, batch_b)):
        conn.execute("select 1 from treadle.jobs where id = any(%s) order by id for update", ([j[0] for j in batch],))
    sql = "select state from treadle.complete_many(%s, %s)"
    thread_a, answer_a = in_thread(a, sql, ([j[0] for j in batch_a], [j[1] for j in batch_a]))
    thread_a.join(5)
    thread_b, answer_b = in_thread(b, sql, ([j[0] for j in batch_b], [j[1] for j in batch_b]))
    thread_a.join(60)
    thread_b.join(60)
    assert answer_a == [[("cancelled",), ("completed",)]], answer_a
    assert answer_b == [[("cancelled",), ("completed",)]], answer_b
    # r1's cancel was left for a re-check: the next claim moves it first
    assert value(setup, "select count(*) from treadle.run_rechecks where run_id = %s", (r1,)) == 1
    assert claim(setup) == {}
    assert value(setup, "select count(*) from treadle.run_rechecks") == 0
    runs: dict[int, str] = dict(
        setup.execute("select id, state from treadle.workflow_runs where id = any(%s)", ([r1, r2],))
    )
    assert runs == {r1: "cancelled", r2: "cancelled"}, runs
    assert live_jobs(setup, r1) == [] and live_jobs(setup, r2) == []


def test_two_steps_of_a_run_that_end_cancelled_at_once(connect: Connect) -> None:
    """cancel_workflow asked both running steps of a run to stop; their finishes, on two
    connections, each hold their own job: before, each waited for the other's (the jobs under
    way of its run's tree): 40P01. Now the second leaves the cancel for a re-check, and the first
    to finish cancels the run."""
    setup = connect()
    run = value(
        setup,
        "select treadle.start_workflow('fan3', steps => array['a', 'b', 'c'], queue => %s, after => %s)",
        (QUEUE, Jsonb({"a": [], "b": [], "c": ["a", "b"]})),
    )
    jobs = claim(setup)
    assert value(setup, "select treadle.cancel_workflow(%s)", (run,)) is True
    first, second = connect(autocommit=False), connect(autocommit=False)
    first.execute("select 1 from treadle.jobs where id = %s for update", (jobs[(run, "a")][0],))
    second.execute("select 1 from treadle.jobs where id = %s for update", (jobs[(run, "b")][0],))
    thread_1, answer_1 = in_thread(first, "select treadle.complete(%s, %s)", jobs[(run, "a")])
    thread_1.join(5)
    thread_2, answer_2 = in_thread(second, "select treadle.complete(%s, %s)", jobs[(run, "b")])
    thread_1.join(60)
    thread_2.join(60)
    assert answer_1 == [[("cancelled",)]], answer_1
    assert answer_2 == [[("cancelled",)]], answer_2
    assert claim(setup) == {}
    assert value(setup, "select state from treadle.workflow_runs where id = %s", (run,)) == "cancelled"
    assert value(setup, "select count(*) from treadle.run_rechecks") == 0
    assert live_jobs(setup, run) == []
