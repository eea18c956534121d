"""Sessions that finish batches of list steps at once (treadle._advance_lists) while others
cancel runs: no deadlock, no step lost, no step enqueued twice. The runs are list runs and
list child runs of graph parents, so a batch holds steps of many runs and a child's end
moves a parent that another session's batch moves too."""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.sql.sqlcalls import Connect, value

QUEUE = "lists-race"
LISTS = 30
PARENTS = 10


def test_batches_of_list_steps_and_cancels_settle_without_a_lost_or_doubled_step(connect: Connect) -> None:
    setup = connect()
    setup.execute("select treadle.define_workflow('kid', array['k1', 'k2', 'k3'])")
    lists = [
        value(setup, "select treadle.start_workflow('lin', steps => array['a', 'b', 'c', 'd'], queue => %s)", (QUEUE,))
        for _ in range(LISTS)
    ]
    parents = [
        value(
            setup,
            "select treadle.start_workflow('par', steps => array['p1', 'c1', 'c2', 'p2'], queue => %s,"
            " after => %s, children => %s)",
            (
                QUEUE,
                json.dumps({"p1": [], "c1": [], "c2": [], "p2": ["c1", "c2"]}),
                json.dumps({"c1": {"workflow": "kid"}, "c2": {"workflow": "kid"}}),
            ),
        )
        for _ in range(PARENTS)
    ]
    workers = [connect() for _ in range(3)]
    canceller = connect()
    start = threading.Barrier(len(workers) + 1)
    stop = threading.Event()

    def work(i: int) -> int:
        conn = workers[i]
        start.wait()
        finished = 0
        idle_since = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = conn.execute(
                "select id, lease_token from treadle.claim(%s, array[%s], batch => 6) order by id desc",
                (f"w{i}", QUEUE),
            ).fetchall()
            if rows:
                idle_since = None
                ids, tokens = [r[0] for r in rows], [r[1] for r in rows]
                if i == 0:
                    states = conn.execute(
                        "select finished_state from treadle.complete_and_claim(%s, %s, null, 'w0', array['none'],"
                        " batch => 1) where finished_id is not null",
                        (ids, tokens),
                    ).fetchall()
                else:
                    states = conn.execute("select state from treadle.complete_many(%s, %s)", (ids, tokens)).fetchall()
                assert {s for (s,) in states} <= {"completed", "cancelled"}
                finished += len(states)
                continue
            if stop.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 0.5:
                    return finished
            time.sleep(0.01)
        raise AssertionError("the runs never settled")

    def cancel_some() -> list[int]:
        start.wait()
        chosen = random.Random(7).sample(lists, 8) + random.Random(8).sample(parents, 3)
        said = []
        for run_id in chosen:
            time.sleep(0.003)
            if value(canceller, "select treadle.cancel_workflow(%s)", (run_id,)):
                said.append(run_id)
        stop.set()
        return said

    with ThreadPoolExecutor(len(workers) + 1) as pool:
        done = [pool.submit(work, i) for i in range(len(workers))]
        cancelled = pool.submit(cancel_some).result()
        finished = sum(f.result() for f in done)

    assert finished > 0
    # nothing is left to run, and no step of any run was enqueued twice
    assert setup.execute(
        "select count(*) from treadle.jobs where state in ('available', 'retryable', 'running', 'blocked')"
    ).fetchone() == (0,)
    doubled = setup.execute(
        "select workflow_run_id, step, count(*) from treadle.jobs where workflow_run_id is not null"
        " group by 1, 2 having count(*) > 1"
    ).fetchall()
    assert doubled == []
    runs = setup.execute("select id, state, steps, results, after from treadle.workflow_runs order by id").fetchall()
    for run_id, state, steps, results, after in runs:
        assert state in {"completed", "cancelled"}, (run_id, state)
        if state == "completed":
            assert sorted(results) == sorted(steps), run_id  # no step lost
        if after is None:
            # a list run stopped at its first unfinished step: one job per step up to there
            ran = [
                s
                for (s,) in setup.execute(
                    "select step from treadle.jobs where workflow_run_id = %s order by id", (run_id,)
                ).fetchall()
            ]
            assert ran == steps[: len(ran)], run_id
            assert sorted(results) == sorted(steps[: len(results)]), run_id
    for run_id in cancelled:
        assert dict((r[0], r[1]) for r in runs)[run_id] == "cancelled"
