"""Compensation through real connections: two branches of each run that fail for good at
the same instant on separate connections start its compensations once, and each
compensation, once completed, never runs again."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, value

RUNS = 60


def leases(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], tuple[int, str]]:
    rows = conn.execute(
        "select workflow_run_id, step, id, lease_token from treadle.claim('w', array[%s], batch => 1000)", (queue,)
    ).fetchall()
    return {(run_id, step): (job_id, token) for run_id, step, job_id, token in rows}


def test_branches_failing_together_compensate_each_run_once(connect: Connect) -> None:
    setup = connect()
    run_ids = [
        value(
            setup,
            "select treadle.start_workflow('saga', steps => array['a', 'b1', 'b2'], queue => 'saga', "
            "after => %s, compensations => %s)",
            (Jsonb({"b1": ["a"], "b2": ["a"]}), Jsonb({"a": "undo_a"})),
        )
        for _ in range(RUNS)
    ]
    for (_, step), (job_id, token) in leases(setup, "saga").items():
        assert step == "a"
        assert value(setup, "select treadle.complete(%s, %s, '\"done\"')", (job_id, token)) == "completed"
    held = leases(setup, "saga")
    assert len(held) == RUNS * 2
    conns = [connect(), connect()]
    barrier = threading.Barrier(2)

    def fail_branch(i: int) -> list[str]:
        answers = []
        for run_id in run_ids:
            barrier.wait(60)
            job_id, token = held[(run_id, f"b{i + 1}")]
            answers.append(value(conns[i], "select treadle.fail(%s, %s, 'no', retryable => false)", (job_id, token)))
        return answers

    with ThreadPoolExecutor(2) as pool:
        answers = [a for f in [pool.submit(fail_branch, i) for i in range(2)] for a in f.result()]
    assert answers == ["discarded"] * (RUNS * 2)
    undo = setup.execute(
        "select workflow_run_id, count(*) from treadle.jobs where queue = 'saga' and step = 'undo_a' group by 1"
    ).fetchall()
    assert sorted(undo) == [(run_id, 1) for run_id in sorted(run_ids)]
    assert setup.execute(
        "select state, count(*) from treadle.workflow_runs where id = any(%s) group by 1", (run_ids,)
    ).fetchall() == [("compensating", RUNS)]

    for (_, step), (job_id, token) in leases(setup, "saga").items():
        assert step == "undo_a"
        assert value(setup, "select treadle.complete(%s, %s, '\"undone\"')", (job_id, token)) == "completed"
    assert setup.execute(
        "select state, results -> 'undo_a', count(*) from treadle.workflow_runs where id = any(%s) group by 1, 2",
        (run_ids,),
    ).fetchall() == [("compensated", "undone", RUNS)]
    assert leases(setup, "saga") == {}  # nothing left to run
