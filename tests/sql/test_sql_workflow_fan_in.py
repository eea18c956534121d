"""Fan-in exactly once: branches of a workflow graph that complete at the same instant on
separate connections enqueue their join step once, never twice and never zero times.
Each completion locks the run row before it reads the results; a branch whose run row
another transaction holds does not wait for it: it is left for a re-check
(073_workflow_rechecks.sql), which the next claim on its queue (or treadle.rescue) moves
once both committed, and so sees both results."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, row, value

BRANCHES = ["b1", "b2", "b3", "b4"]
STEPS = [*BRANCHES, "join"]
AFTER = {"join": BRANCHES}
RUNS = 100


def start(conn: psycopg.Connection, queue: str) -> int:
    run_id: int = value(
        conn,
        "select treadle.start_workflow('fan', '{}', steps => %s, queue => %s, after => %s)",
        (STEPS, queue, Jsonb(AFTER)),
    )
    return run_id


def leases(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], tuple[int, str]]:
    """Claim every waiting step of the queue: (run, step) -> (job id, lease token)."""
    rows = conn.execute(
        "select workflow_run_id, step, id, lease_token from treadle.claim('w', array[%s], batch => 1000)", (queue,)
    ).fetchall()
    return {(run_id, step): (job_id, token) for run_id, step, job_id, token in rows}


def jobs_per_step(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], int]:
    rows = conn.execute(
        "select workflow_run_id, step, count(*) from treadle.jobs where queue = %s group by 1, 2", (queue,)
    ).fetchall()
    return {(run_id, step): count for run_id, step, count in rows}


def test_the_second_branch_does_not_wait_for_the_first_and_the_next_move_enqueues_the_join(
    connect: Connect,
) -> None:
    first, second = connect(autocommit=False), connect()
    second.execute("set lock_timeout = '200ms'")  # a wait for the run row would raise
    run_id = value(
        second,
        "select treadle.start_workflow('pair', steps => array['x', 'y', 'join'], queue => 'pair', "
        'after => \'{"join": ["x", "y"]}\')',
    )
    held = leases(second, "pair")
    x_id, x_token = held[(run_id, "x")]
    y_id, y_token = held[(run_id, "y")]
    assert value(first, "select treadle.complete(%s, %s, '1')", (x_id, x_token)) == "completed"
    # the run row `first` holds is not waited for: y is left for a re-check
    assert value(second, "select treadle.complete(%s, %s, '2')", (y_id, y_token)) == "completed"
    assert value(second, "select count(*) from treadle.run_rechecks where job_id = %s", (y_id,)) == 1
    first.commit()
    assert (run_id, "join") not in jobs_per_step(second, "pair")
    second.execute("select treadle.rescue()")  # (as the next claim on the queue does)
    assert jobs_per_step(second, "pair") == {(run_id, "x"): 1, (run_id, "y"): 1, (run_id, "join"): 1}
    assert row(second, "select state from treadle.jobs where workflow_run_id = %s and step = 'join'", (run_id,)) == (
        "available",
    )
    assert value(second, "select treadle.workflow_step_results(%s, 'join')", (run_id,)) == {"x": 1, "y": 2}


def test_a_branch_rolled_back_leaves_the_join_to_the_other(connect: Connect) -> None:
    first, second = connect(autocommit=False), connect()
    second.execute("set lock_timeout = '200ms'")
    run_id = value(
        second,
        "select treadle.start_workflow('pair', steps => array['x', 'y', 'join'], queue => 'pair', "
        'after => \'{"join": ["x", "y"]}\')',
    )
    held = leases(second, "pair")
    assert value(first, "select treadle.complete(%s, %s, '1')", held[(run_id, "x")]) == "completed"
    assert value(second, "select treadle.complete(%s, %s, '2')", held[(run_id, "y")]) == "completed"
    first.rollback()  # x did not complete after all: no join yet
    second.execute("select treadle.rescue()")  # y's re-check moves the run: y recorded, no join
    assert (run_id, "join") not in jobs_per_step(second, "pair")
    assert value(second, "select count(*) from treadle.run_rechecks where run_id = %s", (run_id,)) == 0
    assert value(second, "select treadle.complete(%s, %s, '1')", held[(run_id, "x")]) == "completed"
    assert jobs_per_step(second, "pair")[(run_id, "join")] == 1
    assert value(second, "select treadle.workflow_step_results(%s, 'join')", (run_id,)) == {"x": 1, "y": 2}


def finish_joins(conn: psycopg.Connection, queue: str) -> None:
    for (_, step), (job_id, token) in leases(conn, queue).items():
        assert step == "join"
        assert value(conn, "select treadle.complete(%s, %s, '\"joined\"')", (job_id, token)) == "completed"


def check_every_run(conn: psycopg.Connection, queue: str, run_ids: list[int]) -> None:
    # the branches left for a re-check move their runs (as the next claim on the queue does)
    conn.execute("select treadle.rescue()")
    assert value(conn, "select count(*) from treadle.run_rechecks where queue = %s", (queue,)) == 0
    counts = jobs_per_step(conn, queue)
    assert counts == {(run_id, step): 1 for run_id in run_ids for step in STEPS}
    finish_joins(conn, queue)
    states = conn.execute(
        "select state, count(*) from treadle.workflow_runs where queue = %s group by state", (queue,)
    ).fetchall()
    assert states == [("completed", len(run_ids))]
    results = conn.execute("select distinct results from treadle.workflow_runs where queue = %s", (queue,)).fetchall()
    assert results == [({"b1": "b1", "b2": "b2", "b3": "b3", "b4": "b4", "join": "joined"},)]


def test_many_runs_whose_branches_complete_at_the_same_instant_join_once(connect: Connect) -> None:
    """Four connections, one per branch, complete their branch of each run together (a
    barrier per run): every run gets exactly one join job."""
    setup = connect()
    run_ids = [start(setup, "fan-each") for _ in range(RUNS)]
    held = leases(setup, "fan-each")
    assert len(held) == RUNS * len(BRANCHES)
    conns = [connect() for _ in BRANCHES]
    barrier = threading.Barrier(len(BRANCHES))

    def complete_branch(i: int) -> list[str]:
        conn, branch = conns[i], BRANCHES[i]
        answers = []
        for run_id in run_ids:
            barrier.wait(60)
            job_id, token = held[(run_id, branch)]
            answers.append(value(conn, "select treadle.complete(%s, %s, %s)", (job_id, token, Jsonb(branch))))
        return answers

    with ThreadPoolExecutor(len(BRANCHES)) as pool:
        answers = [a for f in [pool.submit(complete_branch, i) for i in range(len(BRANCHES))] for a in f.result()]
    assert answers == ["completed"] * (RUNS * len(BRANCHES))
    check_every_run(setup, "fan-each", run_ids)


def test_many_runs_completed_in_batches_across_runs_join_once(connect: Connect) -> None:
    """Each connection completes its branch of every run in one complete_many, all four at
    once: the batches cross on every run row, and every run still gets one join."""
    setup = connect()
    run_ids = [start(setup, "fan-batch") for _ in range(RUNS)]
    held = leases(setup, "fan-batch")
    conns = [connect() for _ in BRANCHES]
    barrier = threading.Barrier(len(BRANCHES))

    def complete_branch(i: int) -> list[str]:
        branch = BRANCHES[i]
        ids = [held[(run_id, branch)][0] for run_id in run_ids]
        tokens = [held[(run_id, branch)][1] for run_id in run_ids]
        barrier.wait(60)
        rows = (
            conns[i]
            .execute(
                "select state from treadle.complete_many(%s, %s, %s::jsonb[])",
                (ids, tokens, [Jsonb(branch)] * len(ids)),
            )
            .fetchall()
        )
        return [state for (state,) in rows]

    with ThreadPoolExecutor(len(BRANCHES)) as pool:
        answers = [a for f in [pool.submit(complete_branch, i) for i in range(len(BRANCHES))] for a in f.result()]
    assert answers == ["completed"] * (RUNS * len(BRANCHES))
    check_every_run(setup, "fan-batch", run_ids)


def test_sleeps_ended_by_rescues_racing_each_other_end_once(connect: Connect) -> None:
    """Many runs asleep; four sessions call rescue at once after the sleeps are due: each
    sleep ends once, and the step after it is enqueued once."""
    setup = connect()
    run_ids = [
        value(
            setup,
            "select treadle.start_workflow('nap', steps => array['zz', 'wake'], sleeps => '{\"zz\": \"1 hour\"}',"
            " queue => 'nap')",
        )
        for _ in range(RUNS)
    ]
    assert jobs_per_step(setup, "nap") == {}
    conns = [connect() for _ in range(4)]
    for conn in conns:
        conn.execute("select set_config('treadle.now', (now() + interval '2 hours')::text, false)")
    barrier = threading.Barrier(len(conns))

    def rescue(conn: psycopg.Connection) -> None:
        barrier.wait(60)
        for _ in range(3):
            conn.execute("select treadle.rescue()")

    with ThreadPoolExecutor(len(conns)) as pool:
        for future in [pool.submit(rescue, conn) for conn in conns]:
            future.result()
    assert jobs_per_step(setup, "nap") == {(run_id, "wake"): 1 for run_id in run_ids}
    assert setup.execute(
        "select count(*) from treadle.workflow_runs where queue = 'nap' and results ? 'zz' and wakes is null"
    ).fetchone() == (RUNS,)
