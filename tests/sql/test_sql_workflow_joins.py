"""treadle.complete_and_claim moves the run of a step that may make a join ready after its
claim (073_workflow_joins.sql): the join is still enqueued exactly once, a worker hears of
it, and a step whose successors wait for it alone is still claimed by the same call."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, value

BRANCHES = ["b1", "b2", "b3", "b4"]
RUNS = 60
CYCLE = (
    "select finished_id, finished_state, (job).step, (job).workflow_run_id"
    " from treadle.complete_and_claim(%s, %s, %s::jsonb[], 'w', array[%s], batch => %s)"
)


def start(conn: psycopg.Connection, queue: str, steps: list[str], after: dict[str, list[str]]) -> int:
    run_id: int = value(
        conn,
        "select treadle.start_workflow('fan', '{}', steps => %s, queue => %s, after => %s)",
        (steps, queue, Jsonb(after)),
    )
    return run_id


def leases(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], tuple[int, str]]:
    rows = conn.execute(
        "select workflow_run_id, step, id, lease_token from treadle.claim('w', array[%s], batch => 1000)", (queue,)
    ).fetchall()
    return {(run_id, step): (job_id, token) for run_id, step, job_id, token in rows}


def jobs_per_step(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], int]:
    rows = conn.execute(
        "select workflow_run_id, step, count(*) from treadle.jobs where queue = %s group by 1, 2", (queue,)
    ).fetchall()
    return {(run_id, step): count for run_id, step, count in rows}


def test_the_last_branch_enqueues_its_join_after_the_claim_and_tells_the_queue(connect: Connect) -> None:
    worker, listener = connect(), connect()
    listener.execute("listen treadle_jobs")
    run_id = start(worker, "pair", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(worker, "pair")
    x, y = held[(run_id, "x")], held[(run_id, "y")]
    rows = worker.execute(CYCLE, ([x[0]], [x[1]], [Jsonb(1)], "pair", 5)).fetchall()
    assert rows == [(x[0], "completed", None, None)]
    list(listener.notifies(timeout=0.2))  # what the start told
    rows = worker.execute(CYCLE, ([y[0]], [y[1]], [Jsonb(2)], "pair", 5)).fetchall()
    # the claim ran before the run moved: the join waits, once, for a worker that hears of it
    assert rows == [(y[0], "completed", None, None)]
    assert jobs_per_step(worker, "pair") == {(run_id, "x"): 1, (run_id, "y"): 1, (run_id, "join"): 1}
    assert value(worker, "select state from treadle.jobs where workflow_run_id = %s and step = 'join'", (run_id,)) == (
        "available"
    )
    assert [(n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=1)] == [("treadle_jobs", "pair")]
    assert value(worker, "select treadle.workflow_step_results(%s, 'join')", (run_id,)) == {"x": 1, "y": 2}
    # the rest of the transaction moves runs at once again
    assert value(worker, "select current_setting('treadle.defer_joins', true)") in (None, "")
    assert value(worker, "select current_setting('treadle.joins_deferred', true)") in (None, "")


def test_a_step_whose_successors_wait_for_it_alone_is_claimed_by_the_same_call(connect: Connect) -> None:
    worker = connect()
    run_id = start(worker, "alone", ["a", "b", "join"], {"b": ["a"], "join": ["b"]})
    (a_id, a_token) = leases(worker, "alone")[(run_id, "a")]
    rows = worker.execute(CYCLE, ([a_id], [a_token], [Jsonb(1)], "alone", 5)).fetchall()
    assert rows == [(a_id, "completed", None, None), (None, None, "b", run_id)]


def test_a_failed_claim_undoes_the_finish_and_the_join(connect: Connect) -> None:
    worker = connect()
    run_id = start(worker, "undo", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(worker, "undo")
    x, y = held[(run_id, "x")], held[(run_id, "y")]
    worker.execute(CYCLE, ([x[0]], [x[1]], [Jsonb(1)], "undo", 0))
    try:
        worker.execute(
            "select * from treadle.complete_and_claim(%s, %s, null, 'w', array['undo'], batch => 1, lease => '2 days')",
            ([y[0]], [y[1]]),
        )
        raise AssertionError("a lease over a day is refused")
    except psycopg.errors.InvalidParameterValue:
        pass
    assert jobs_per_step(worker, "undo") == {(run_id, "x"): 1, (run_id, "y"): 1}
    assert value(worker, "select state from treadle.jobs where id = %s", (y[0],)) == "running"
    assert value(worker, "select current_setting('treadle.joins_deferred', true)") in (None, "")
    worker.execute(CYCLE, ([y[0]], [y[1]], [Jsonb(2)], "undo", 0))
    assert jobs_per_step(worker, "undo")[(run_id, "join")] == 1


def test_branches_finished_by_four_cycles_at_once_join_once(connect: Connect) -> None:
    """Each connection finishes its branch of every run in one complete_and_claim that
    claims from another queue too: the runs move after the claims, each join once."""
    setup = connect()
    after = {"join": BRANCHES}
    run_ids = [start(setup, "fan-cycle", [*BRANCHES, "join"], after) for _ in range(RUNS)]
    for _ in range(8):
        setup.execute("select treadle.enqueue('other', queue => 'fan-other')")
    held = leases(setup, "fan-cycle")
    conns = [connect() for _ in BRANCHES]
    barrier = threading.Barrier(len(BRANCHES))

    def finish_branch(i: int) -> list[str]:
        branch = BRANCHES[i]
        ids = [held[(run_id, branch)][0] for run_id in run_ids]
        tokens = [held[(run_id, branch)][1] for run_id in run_ids]
        barrier.wait(60)
        rows = conns[i].execute(CYCLE, (ids, tokens, [Jsonb(branch)] * len(ids), "fan-other", 2)).fetchall()
        assert len([r for r in rows if r[0] is None]) == 2  # it claimed its two others
        return [r[1] for r in rows if r[0] is not None]

    with ThreadPoolExecutor(len(BRANCHES)) as pool:
        answers = [a for f in [pool.submit(finish_branch, i) for i in range(len(BRANCHES))] for a in f.result()]
    assert answers == ["completed"] * (RUNS * len(BRANCHES))
    # a branch whose run row another cycle held was left for a re-check (073_workflow_rechecks.sql),
    # which the next claims on its queue move (at most 100 each), or treadle.rescue
    setup.execute("select treadle.claim('w', array['fan-cycle'], batch => 1)")
    setup.execute("select treadle.rescue()")
    assert value(setup, "select count(*) from treadle.run_rechecks where queue = 'fan-cycle'") == 0
    assert jobs_per_step(setup, "fan-cycle") == {
        (run_id, step): 1 for run_id in run_ids for step in [*BRANCHES, "join"]
    }
    results = setup.execute(
        "select distinct treadle.workflow_step_results(id, 'join') from treadle.workflow_runs where queue = 'fan-cycle'"
    ).fetchall()
    assert results == [({"b1": "b1", "b2": "b2", "b3": "b3", "b4": "b4"},)]


def test_the_second_cycle_does_not_wait_for_the_first_and_the_next_claim_joins(connect: Connect) -> None:
    """The first branch's transaction is open, its run row locked; the second's
    complete_and_claim does not wait for it: its branch is left for a re-check
    (073_workflow_rechecks.sql), which the next claim on the queue, after the first
    committed, moves: one join, with both results."""
    first, second = connect(autocommit=False), connect()
    second.execute("set lock_timeout = '200ms'")  # a wait for the run row would raise
    run_id = start(second, "turns", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(second, "turns")
    x, y = held[(run_id, "x")], held[(run_id, "y")]
    first.execute(CYCLE, ([x[0]], [x[1]], [Jsonb(1)], "turns-none", 1))
    second.execute("select treadle.enqueue('other', queue => 'turns')")
    answer = second.execute(CYCLE, ([y[0]], [y[1]], [Jsonb(2)], "turns", 1)).fetchall()
    assert answer == [(y[0], "completed", None, None), (None, None, None, None)]
    assert (run_id, "join") not in jobs_per_step(second, "turns")
    first.commit()
    assert second.execute(CYCLE, ([], [], [], "turns", 1)).fetchall() == [(None, None, "join", run_id)]
    assert jobs_per_step(second, "turns")[(run_id, "join")] == 1
    assert value(second, "select treadle.workflow_step_results(%s, 'join')", (run_id,)) == {"x": 1, "y": 2}


def test_map_elements_finished_by_cycles_at_once_start_the_next_step_once(connect: Connect) -> None:
    setup = connect()
    run_id: int = value(
        setup,
        "select treadle.start_workflow('thumbs', '{}', steps => array['load', 'resize', 'report'],"
        " maps => '{\"resize\": \"load\"}', queue => 'map-cycle')",
    )
    (load_id, load_token) = leases(setup, "map-cycle")[(run_id, "load")]
    setup.execute(CYCLE, ([load_id], [load_token], [Jsonb(list(range(40)))], "map-cycle", 0))
    rows = setup.execute("select id, lease_token from treadle.claim('w', array['map-cycle'], batch => 1000)").fetchall()
    assert len(rows) == 40
    conns = [connect() for _ in range(4)]
    barrier = threading.Barrier(4)

    def finish(i: int) -> None:
        mine = rows[i::4]
        barrier.wait(60)
        conns[i].execute(CYCLE, ([r[0] for r in mine], [r[1] for r in mine], [Jsonb(i)] * len(mine), "map-none", 1))

    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(finish, i) for i in range(4)]:
            future.result()
    assert jobs_per_step(setup, "map-cycle")[(run_id, "report")] == 1
    assert value(setup, "select map_left from treadle.workflow_runs where id = %s", (run_id,)) is None
