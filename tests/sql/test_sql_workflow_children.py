"""Child workflows through real connections: a child step starts its child run once, even
when the steps before it complete at the same instant on separate connections; a child
that completes, fails or is cancelled moves its parent in the same transaction; children
that complete together join their parent's next step once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, row, value

RUNS = 60


def define(conn: psycopg.Connection) -> None:
    conn.execute("select treadle.define_workflow('kid', array['k1', 'k2'])")


def leases(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], tuple[int, str]]:
    """Claim every waiting step of the queue: (run, step) -> (job id, lease token)."""
    rows = conn.execute(
        "select workflow_run_id, step, id, lease_token from treadle.claim('w', array[%s], batch => 1000)", (queue,)
    ).fetchall()
    return {(run_id, step): (job_id, token) for run_id, step, job_id, token in rows}


def complete(conn: psycopg.Connection, held: tuple[int, str], result: object) -> str:
    answer: str = value(conn, "select treadle.complete(%s, %s, %s)", (held[0], held[1], Jsonb(result)))
    return answer


def finish_children(conn: psycopg.Connection, queue: str) -> None:
    """Complete every step of every child run in the queue, k1 then k2."""
    for _ in range(2):
        for (_, step), held in leases(conn, queue).items():
            assert complete(conn, held, step) == "completed"


def children_of(conn: psycopg.Connection, run_id: int) -> list[tuple[str, str]]:
    return conn.execute(
        "select parent_step, state from treadle.workflow_runs where parent_run_id = %s order by id", (run_id,)
    ).fetchall()


def test_a_child_completes_and_its_parent_moves_on(connect: Connect) -> None:
    conn = connect()
    define(conn)
    run_id = value(
        conn,
        "select treadle.start_workflow('parent', '{\"x\": 1}', steps => array['prep', 'pay', 'after'], "
        'queue => \'fam\', children => \'{"pay": {"workflow": "kid", "queue": "kids"}}\')',
    )
    (held,) = leases(conn, "fam").values()
    assert complete(conn, held, {"prepared": True}) == "completed"
    assert children_of(conn, run_id) == [("pay", "running")]
    child_id, child_input = row(conn, "select id, input from treadle.workflow_runs where parent_run_id = %s", (run_id,))
    assert child_input == {"prep": {"prepared": True}}
    finish_children(conn, "kids")
    assert row(conn, "select state from treadle.workflow_runs where id = %s", (child_id,)) == ("completed",)
    assert value(conn, "select treadle.workflow_results(%s) -> 'pay'", (run_id,)) == {"k1": "k1", "k2": "k2"}
    ((_, step),) = leases(conn, "fam")
    assert step == "after"


def test_a_child_that_fails_fails_its_parent(connect: Connect) -> None:
    conn = connect()
    define(conn)
    run_id = value(
        conn,
        "select treadle.start_workflow('parent', steps => array['pay', 'after'], queue => 'fam', "
        'children => \'{"pay": {"workflow": "kid"}}\')',
    )
    ((_, step), (job_id, token)) = next(iter(leases(conn, "fam").items()))
    assert step == "k1"  # the child runs in the parent's queue
    assert value(conn, "select treadle.fail(%s, %s, 'card declined', retryable => false)", (job_id, token)) == (
        "discarded"
    )
    assert children_of(conn, run_id) == [("pay", "failed")]
    assert row(conn, "select state, finished_at is not null from treadle.workflow_runs where id = %s", (run_id,)) == (
        "failed",
        True,
    )
    assert value(conn, "select count(*) from treadle.jobs where workflow_run_id = %s", (run_id,)) == 0


def test_cancelling_the_parent_cancels_the_child_and_its_running_step(connect: Connect) -> None:
    conn = connect()
    define(conn)
    run_id = value(
        conn,
        "select treadle.start_workflow('parent', steps => array['pay'], queue => 'fam', "
        'children => \'{"pay": {"workflow": "kid"}}\')',
    )
    (held,) = leases(conn, "fam").values()  # the child's k1 runs
    assert value(conn, "select treadle.cancel_workflow(%s)", (run_id,)) is True
    assert row(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == ("running",)
    assert complete(conn, held, "late") == "cancelled"
    assert children_of(conn, run_id) == [("pay", "cancelled")]
    assert row(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == ("cancelled",)


def test_the_second_branch_does_not_wait_for_the_first_and_the_child_starts_once(connect: Connect) -> None:
    first, second = connect(autocommit=False), connect()
    second.execute("set lock_timeout = '200ms'")  # a wait for the run row would raise
    define(second)
    run_id = value(
        second,
        "select treadle.start_workflow('pair', steps => array['x', 'y', 'kid'], queue => 'pair', "
        'after => \'{"kid": ["x", "y"]}\', children => \'{"kid": {"workflow": "kid"}}\')',
    )
    held = leases(second, "pair")
    assert complete(first, held[(run_id, "x")], 1) == "completed"
    # not waited for the run row `first` holds: left for a re-check (073_workflow_rechecks.sql)
    assert complete(second, held[(run_id, "y")], 2) == "completed"
    first.commit()
    assert children_of(second, run_id) == []
    second.execute("select treadle.rescue()")  # (as the next claim on the queue does)
    assert children_of(second, run_id) == [("kid", "running")]
    assert value(second, "select input from treadle.workflow_runs where parent_run_id = %s", (run_id,)) == {
        "x": 1,
        "y": 2,
    }


def test_many_runs_whose_branches_complete_together_start_one_child_each(connect: Connect) -> None:
    """Two connections complete the two steps before a child step of each run together (a
    barrier per run): every run starts exactly one child run."""
    setup = connect()
    define(setup)
    run_ids = [
        value(
            setup,
            "select treadle.start_workflow('pair', steps => array['x', 'y', 'kid'], queue => 'race', "
            'after => \'{"kid": ["x", "y"]}\', children => \'{"kid": {"workflow": "kid", '
            '"queue": "race-kids"}}\')',
        )
        for _ in range(RUNS)
    ]
    held = leases(setup, "race")
    conns = [connect(), connect()]
    barrier = threading.Barrier(2)

    def complete_branch(i: int) -> list[str]:
        answers = []
        for run_id in run_ids:
            barrier.wait(60)
            answers.append(complete(conns[i], held[(run_id, "xy"[i])], i))
        return answers

    with ThreadPoolExecutor(2) as pool:
        answers = [a for f in [pool.submit(complete_branch, i) for i in range(2)] for a in f.result()]
    assert answers == ["completed"] * (RUNS * 2)
    setup.execute("select treadle.rescue()")  # the branches left for a re-check (as the next claim does)
    counts = setup.execute(
        "select parent_run_id, count(*) from treadle.workflow_runs where parent_run_id = any(%s) group by 1",
        (run_ids,),
    ).fetchall()
    assert sorted(counts) == [(run_id, 1) for run_id in sorted(run_ids)]
    assert value(setup, "select count(*) from treadle.jobs where queue = 'race-kids'") == RUNS  # each child's k1
    finish_children(setup, "race-kids")
    assert setup.execute(
        "select state, count(*) from treadle.workflow_runs where id = any(%s) group by 1", (run_ids,)
    ).fetchall() == [("completed", RUNS)]


def test_children_that_complete_together_join_their_parent_once(connect: Connect) -> None:
    """Each run has two child steps and a join after both; two connections complete the
    last steps of the two children of each run together: the join is enqueued once."""
    setup = connect()
    setup.execute("select treadle.define_workflow('one', array['only'])")
    run_ids = [
        value(
            setup,
            "select treadle.start_workflow('twins', steps => array['c1', 'c2', 'join'], queue => 'twins', "
            'after => \'{"join": ["c1", "c2"]}\', children => '
            '\'{"c1": {"workflow": "one", "queue": "twins-kids"}, "c2": {"workflow": "one", "queue": "twins-kids"}}\')',
        )
        for _ in range(RUNS)
    ]
    held = leases(setup, "twins-kids")
    assert len(held) == RUNS * 2
    step_of: dict[int, str] = dict(
        setup.execute(
            "select id, parent_step from treadle.workflow_runs where parent_run_id = any(%s)", (run_ids,)
        ).fetchall()
    )
    by_parent: dict[tuple[int, str], tuple[int, str]] = {}
    for (child_id, _), lease in held.items():
        parent = value(setup, "select parent_run_id from treadle.workflow_runs where id = %s", (child_id,))
        by_parent[(parent, step_of[child_id])] = lease
    conns = [connect(), connect()]
    barrier = threading.Barrier(2)

    def complete_child(i: int) -> list[str]:
        answers = []
        for run_id in run_ids:
            barrier.wait(60)
            answers.append(complete(conns[i], by_parent[(run_id, f"c{i + 1}")], i))
        return answers

    with ThreadPoolExecutor(2) as pool:
        answers = [a for f in [pool.submit(complete_child, i) for i in range(2)] for a in f.result()]
    assert answers == ["completed"] * (RUNS * 2)
    joins = setup.execute(
        "select workflow_run_id, count(*) from treadle.jobs where queue = 'twins' and step = 'join' group by 1"
    ).fetchall()
    assert sorted(joins) == [(run_id, 1) for run_id in sorted(run_ids)]
    assert setup.execute(
        "select distinct results from treadle.workflow_runs where id = any(%s)", (run_ids,)
    ).fetchall() == [({"c1": {"only": 0}, "c2": {"only": 1}},)]
