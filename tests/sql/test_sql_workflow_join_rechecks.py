"""A completed branch whose run row another transaction holds does not wait for it: it is
left in treadle.run_rechecks (073_workflow_rechecks.sql), and the next claim on its queue
(or treadle.rescue) moves the run: the join is enqueued exactly once, never zero times."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.conftest import as_role
from tests.sql.sqlcalls import Connect, value

BRANCHES = ["b1", "b2", "b3", "b4"]


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


def complete(conn: psycopg.Connection, held: tuple[int, str], result: object) -> str:
    state: str = value(conn, "select treadle.complete(%s, %s, %s)", (held[0], held[1], Jsonb(result)))
    return state


def jobs_per_step(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], int]:
    rows = conn.execute(
        "select workflow_run_id, step, count(*) from treadle.jobs where queue = %s group by 1, 2", (queue,)
    ).fetchall()
    return {(run_id, step): count for run_id, step, count in rows}


def rechecks(conn: psycopg.Connection, queue: str) -> list[tuple[int, int]]:
    rows = conn.execute(
        "select job_id, run_id from treadle.run_rechecks where queue = %s order by job_id", (queue,)
    ).fetchall()
    return [(job_id, run_id) for job_id, run_id in rows]


def hold_run(conn: psycopg.Connection, run_id: int) -> None:
    """Lock the run row in conn's open transaction (as a finishing branch does)."""
    conn.execute("select 1 from treadle.workflow_runs where id = %s for update", (run_id,))


def test_a_branch_does_not_wait_for_a_held_run_and_the_next_claim_enqueues_the_join(connect: Connect) -> None:
    first, second, listener = connect(autocommit=False), connect(), connect()
    second.execute("set lock_timeout = '200ms'")  # a wait for the run row would raise
    run_id = start(second, "rc-claim", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(second, "rc-claim")
    listener.execute("listen treadle_jobs")
    assert complete(first, held[(run_id, "x")], 1) == "completed"  # first holds the run row, uncommitted
    assert complete(second, held[(run_id, "y")], 2) == "completed"  # no wait: left for a re-check
    assert rechecks(second, "rc-claim") == [(held[(run_id, "y")][0], run_id)]
    # its queue's workers hear of it
    assert [(n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=1)] == [
        ("treadle_jobs", "rc-claim")
    ]
    # a claim while the run row is still held leaves the re-check for the next
    assert second.execute("select id from treadle.claim('w', array['rc-claim'])").fetchall() == []
    assert rechecks(second, "rc-claim") == [(held[(run_id, "y")][0], run_id)]
    first.commit()
    # the next claim moves the run and takes the join it enqueued
    rows = second.execute("select workflow_run_id, step from treadle.claim('w', array['rc-claim'])").fetchall()
    assert rows == [(run_id, "join")]
    assert rechecks(second, "rc-claim") == []
    assert jobs_per_step(second, "rc-claim") == {(run_id, "x"): 1, (run_id, "y"): 1, (run_id, "join"): 1}
    assert value(second, "select treadle.workflow_step_results(%s, 'join')", (run_id,)) == {"x": 1, "y": 2}


def test_complete_and_claim_and_rescue_move_a_recheck(connect: Connect) -> None:
    holder, conn = connect(autocommit=False), connect()
    conn.execute("set lock_timeout = '200ms'")
    run_ids = [start(conn, "rc-cycle", ["x", "y", "join"], {"join": ["x", "y"]}) for _ in range(2)]
    held = leases(conn, "rc-cycle")
    for run_id in run_ids:
        complete(conn, held[(run_id, "x")], 1)
        hold_run(holder, run_id)
    # complete_and_claim's finish leaves both (their runs are held), and its end cannot move them
    ids = [held[(run_id, "y")][0] for run_id in run_ids]
    tokens = [held[(run_id, "y")][1] for run_id in run_ids]
    rows = conn.execute(
        "select finished_state from treadle.complete_and_claim(%s, %s, null, 'w', array['rc-cycle'], batch => 5)",
        (ids, tokens),
    ).fetchall()
    assert rows == [("completed",), ("completed",)]
    assert len(rechecks(conn, "rc-cycle")) == 2
    holder.commit()
    # complete_and_claim with nothing to finish and no claim moves them at its end ...
    hold_run(holder, run_ids[1])
    conn.execute("select * from treadle.complete_and_claim('{}', '{}', null, 'w', array['rc-cycle'], batch => 0)")
    assert rechecks(conn, "rc-cycle") == [(ids[1], run_ids[1])]
    holder.commit()
    # ... and rescue moves what is left, of any queue
    assert value(conn, "select treadle.rescue()") == 0
    assert rechecks(conn, "rc-cycle") == []
    assert jobs_per_step(conn, "rc-cycle") == {(r, s): 1 for r in run_ids for s in ["x", "y", "join"]}


def test_a_recheck_of_a_step_already_moved_changes_nothing(connect: Connect) -> None:
    """_advance_run per job is idempotent: a re-check of a step whose result the run holds,
    and _advance_run called again with that step's row, enqueue nothing and change no run."""
    conn = connect()
    run_id = start(conn, "rc-again", ["x", "y", "z", "join"], {"join": ["x", "y", "z"]})
    held = leases(conn, "rc-again")
    complete(conn, held[(run_id, "x")], 1)
    complete(conn, held[(run_id, "y")], 2)
    before_run = value(conn, "select to_jsonb(r) from treadle.workflow_runs as r where id = %s", (run_id,))
    before_jobs = conn.execute("select to_jsonb(j) from treadle.jobs as j where queue = 'rc-again' order by id")
    jobs = before_jobs.fetchall()
    conn.execute(
        "insert into treadle.run_rechecks select queue, id, queue, workflow_run_id, now() from treadle.jobs"
        " where queue = 'rc-again' and step in ('x', 'y')"
    )
    assert value(conn, "select treadle._move_rechecks(array['rc-again'])") == 0
    conn.execute("select treadle._advance_run(j) from treadle.jobs as j where queue = 'rc-again' and step = 'x'")
    assert rechecks(conn, "rc-again") == []
    assert value(conn, "select to_jsonb(r) from treadle.workflow_runs as r where id = %s", (run_id,)) == before_run
    after = conn.execute("select to_jsonb(j) from treadle.jobs as j where queue = 'rc-again' order by id").fetchall()
    assert after == jobs
    # the last branch still enqueues the join once
    complete(conn, held[(run_id, "z")], 3)
    assert jobs_per_step(conn, "rc-again")[(run_id, "join")] == 1


def test_a_cancelled_runs_rechecks_enqueue_nothing(connect: Connect) -> None:
    holder, conn = connect(autocommit=False), connect()
    conn.execute("set lock_timeout = '200ms'")
    run_id = start(conn, "rc-cancel", ["x", "y", "after", "join"], {"after": ["x"], "join": ["x", "y"]})
    held = leases(conn, "rc-cancel")
    hold_run(holder, run_id)
    complete(conn, held[(run_id, "x")], 1)
    complete(conn, held[(run_id, "y")], 2)
    assert len(rechecks(conn, "rc-cancel")) == 2
    holder.execute("select treadle.cancel_workflow(%s)", (run_id,))
    holder.commit()
    assert conn.execute("select id from treadle.claim('w', array['rc-cancel'])").fetchall() == []
    assert rechecks(conn, "rc-cancel") == []
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "cancelled"
    # the branches' results are kept (a retry resumes from them); nothing ran after them
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {"x": 1, "y": 2}
    assert set(jobs_per_step(conn, "rc-cancel")) == {(run_id, "x"), (run_id, "y")}


def test_a_tenant_cannot_read_the_rechecks_and_its_claim_moves_its_own(
    connect: Connect, dsn: str, make_role: Callable[[str], str]
) -> None:
    """No part a grant helper gives reads or writes treadle.run_rechecks; a tenant's claim
    (SECURITY DEFINER) still moves the re-checks of its own queues, and no other's."""
    setup, holder = connect(), connect(autocommit=False)
    roles = {part: make_role(f"rc_{part}") for part in ("reader", "producer", "worker", "dashboard")}
    for part, role in roles.items():
        setup.execute(f"select treadle.grant_{part}(%s)", (role,))
    setup.execute("select treadle.set_tenant(%s, 't.')", (roles["worker"],))
    for role in roles.values():
        for privilege in ("select", "insert", "update", "delete"):
            assert not value(setup, "select has_table_privilege(%s, 'treadle.run_rechecks', %s)", (role, privilege))
    mine = start(setup, "t.rc", ["x", "y", "join"], {"join": ["x", "y"]})
    theirs = start(setup, "u.rc", ["x", "y", "join"], {"join": ["x", "y"]})
    held = {**leases(setup, "t.rc"), **leases(setup, "u.rc")}
    holder.execute("select 1 from treadle.workflow_runs where id = any(%s) for update", ([mine, theirs],))
    for run_id in (mine, theirs):
        complete(setup, held[(run_id, "x")], 1)
        complete(setup, held[(run_id, "y")], 2)
    holder.commit()
    with psycopg.connect(as_role(dsn, roles["worker"]), autocommit=True) as tenant:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            tenant.execute("select * from treadle.run_rechecks")
        rows = tenant.execute("select workflow_run_id, step from treadle.claim('w', array['t.rc'])").fetchall()
        assert rows == [(mine, "join")]
    assert rechecks(setup, "t.rc") == []
    assert len(rechecks(setup, "u.rc")) == 2


def test_four_connections_finish_branches_of_held_runs_and_racing_claims_join_each_once(connect: Connect) -> None:
    """Every run row held while four connections finish their branches (none waits: every
    branch is left for a re-check); then four connections claim at once: the movers race
    on the re-checks (SKIP LOCKED) and each join is enqueued exactly once."""
    runs = 40
    setup, holder = connect(), connect(autocommit=False)
    run_ids = [start(setup, "rc-race", [*BRANCHES, "join"], {"join": BRANCHES}) for _ in range(runs)]
    held = leases(setup, "rc-race")
    holder.execute("select 1 from treadle.workflow_runs where queue = 'rc-race' order by id for update")
    conns = [connect() for _ in BRANCHES]
    for conn in conns:
        conn.execute("set lock_timeout = '2s'")
    barrier = threading.Barrier(len(BRANCHES))

    def finish_branch(i: int) -> list[str]:
        ids = [held[(run_id, BRANCHES[i])][0] for run_id in run_ids]
        tokens = [held[(run_id, BRANCHES[i])][1] for run_id in run_ids]
        barrier.wait(60)
        rows = (
            conns[i]
            .execute(
                "select state from treadle.complete_many(%s, %s, %s::jsonb[])", (ids, tokens, [Jsonb(i)] * len(ids))
            )
            .fetchall()
        )
        return [r[0] for r in rows]

    with ThreadPoolExecutor(len(BRANCHES)) as pool:
        answers = [a for f in [pool.submit(finish_branch, i) for i in range(len(BRANCHES))] for a in f.result()]
    assert answers == ["completed"] * (runs * len(BRANCHES))
    assert len(rechecks(setup, "rc-race")) == runs * len(BRANCHES)
    holder.commit()

    def drain(i: int) -> list[tuple[int, str]]:
        barrier.wait(60)
        took: list[tuple[int, str]] = []
        for _ in range(200):  # until a claim finds nothing and no re-check is left
            rows = (
                conns[i]
                .execute("select workflow_run_id, step from treadle.claim('w', array['rc-race'], batch => 3)")
                .fetchall()
            )
            took += [(r, s) for r, s in rows]
            if not rows and not rechecks(conns[i], "rc-race"):
                break
        return took

    with ThreadPoolExecutor(len(BRANCHES)) as pool:
        taken = [t for f in [pool.submit(drain, i) for i in range(len(BRANCHES))] for t in f.result()]
    assert sorted(taken) == sorted((run_id, "join") for run_id in run_ids)
    assert rechecks(setup, "rc-race") == []
    assert jobs_per_step(setup, "rc-race") == {(r, s): 1 for r in run_ids for s in [*BRANCHES, "join"]}
    results = setup.execute(
        "select distinct treadle.workflow_step_results(id, 'join') from treadle.workflow_runs where queue = 'rc-race'"
    ).fetchall()
    assert results == [({"b1": 0, "b2": 1, "b3": 2, "b4": 3},)]


MOVER = """
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1])
conn.execute("select treadle.claim('w', array['rc-fault'])")
print(conn.info.backend_pid, flush=True)
time.sleep(600)
"""


@pytest.mark.subprocess
def test_a_mover_killed_before_its_commit_leaves_the_recheck_and_the_run_still_completes(
    connect: Connect, dsn: str
) -> None:
    """A claim that took a re-check (and enqueued the join) dies before its commit: its
    process SIGKILLed, then a second one's backend terminated. Each time the re-check is
    there again, no join; the next claim enqueues it once and the run completes."""
    holder, conn = connect(autocommit=False), connect()
    run_id = start(conn, "rc-fault", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(conn, "rc-fault")
    hold_run(holder, run_id)
    complete(conn, held[(run_id, "x")], 1)
    complete(conn, held[(run_id, "y")], 2)
    holder.commit()
    assert len(rechecks(conn, "rc-fault")) == 2
    for how in ("sigkill", "terminate"):
        with subprocess.Popen([sys.executable, "-c", MOVER, dsn], stdout=subprocess.PIPE, text=True) as mover:
            try:
                assert mover.stdout is not None
                pid = int(mover.stdout.readline())
                # the mover holds its re-checks and the run, its join written, uncommitted
                assert value(conn, "select count(*) from treadle.run_rechecks where queue = 'rc-fault'") == 2
                assert value(conn, "select treadle._move_rechecks(array['rc-fault'])") == 0  # skipped: taken
                assert value(conn, "select state from pg_stat_activity where pid = %s", (pid,)) == "idle in transaction"
                if how == "sigkill":
                    os.kill(mover.pid, signal.SIGKILL)
                    mover.wait(30)
                else:
                    assert value(conn, "select pg_terminate_backend(%s)", (pid,)) is True
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and value(
                    conn, "select count(*) from pg_stat_activity where pid = %s", (pid,)
                ):
                    time.sleep(0.05)
            finally:
                mover.kill()
        assert len(rechecks(conn, "rc-fault")) == 2
        assert (run_id, "join") not in jobs_per_step(conn, "rc-fault")
    rows = conn.execute("select workflow_run_id, step, id, lease_token from treadle.claim('w', array['rc-fault'])")
    [(got_run, step, join_id, token)] = rows.fetchall()
    assert (got_run, step) == (run_id, "join")
    assert rechecks(conn, "rc-fault") == []
    complete(conn, (join_id, token), "done")
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "completed"
    assert jobs_per_step(conn, "rc-fault") == {(run_id, "x"): 1, (run_id, "y"): 1, (run_id, "join"): 1}


def test_a_recheck_behind_a_backlog_wakes_nobody(connect: Connect) -> None:
    """A claimable job of the queue has waited 50 ms or more: its workers are busy, and the
    next claim moves the re-check; no NOTIFY (whose commit lock every notifier shares)."""
    holder, conn, listener = connect(autocommit=False), connect(), connect()
    run_id = start(conn, "rc-busy", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(conn, "rc-busy")
    conn.execute("select treadle.enqueue('waiting', queue => 'rc-busy', run_at => now() - interval '1 second')")
    listener.execute("listen treadle_jobs")
    hold_run(holder, run_id)
    complete(conn, held[(run_id, "x")], 1)
    assert len(rechecks(conn, "rc-busy")) == 1
    assert list(listener.notifies(timeout=0.5)) == []
    holder.commit()
    rows = conn.execute("select name, step from treadle.claim('w', array['rc-busy'], batch => 5)").fetchall()
    assert rows == [("waiting", None)]  # x moved its run: the join still waits for y
    assert rechecks(conn, "rc-busy") == []
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {"x": 1}


def test_a_claim_under_repeatable_read_leaves_the_rechecks(connect: Connect) -> None:
    """A claim in a REPEATABLE READ transaction moves no re-check (a run row changed since
    its snapshot would raise 40001); the next claim in READ COMMITTED does."""
    holder, conn = connect(autocommit=False), connect()
    run_id = start(conn, "rc-rr", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(conn, "rc-rr")
    hold_run(holder, run_id)
    complete(conn, held[(run_id, "x")], 1)
    holder.commit()
    with conn.transaction():
        conn.execute("set transaction isolation level repeatable read")
        assert conn.execute("select id from treadle.claim('w', array['rc-rr'])").fetchall() == []
        assert len(rechecks(conn, "rc-rr")) == 1
    assert conn.execute("select id from treadle.claim('w', array['rc-rr'])").fetchall() == []
    assert rechecks(conn, "rc-rr") == []
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {"x": 1}


def test_a_move_of_some_queues_takes_the_oldest_rechecks_first(connect: Connect) -> None:
    """Given a list of queues and a max, the re-checks moved are the oldest ones, whatever their
    queue or the table's order: a queue whose steps keep coming never starves another's."""
    holder, conn = connect(autocommit=False), connect()
    runs = {}
    for queue in ["rc-order-a", "rc-order-b"]:  # a's re-check is written first, and sorts first
        runs[queue] = start(conn, queue, ["x", "y", "join"], {"join": ["x", "y"]})
        held = leases(conn, queue)
        hold_run(holder, runs[queue])
        complete(conn, held[(runs[queue], "x")], 1)
        holder.commit()
    # b's is the older one
    conn.execute("update treadle.run_rechecks set added_at = added_at - interval '1 hour' where queue = 'rc-order-b'")
    assert value(conn, "select treadle._move_rechecks(array['rc-order-a', 'rc-order-b'], 1)") == 1
    assert len(rechecks(conn, "rc-order-a")) == 1
    assert rechecks(conn, "rc-order-b") == []
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (runs["rc-order-b"],)) == {"x": 1}


def test_a_fork_carries_a_completed_step_left_for_a_recheck_and_does_not_run_it_again(connect: Connect) -> None:
    """y completed while another transaction held its run row: its result is not on the run
    yet, only in a re-check. A fork made before any claim or rescue moved it keeps y's
    result and never runs y again."""
    holder, conn = connect(autocommit=False), connect()
    run_id = start(conn, "rc-fork", ["x", "y", "join"], {"join": ["x", "y"]})
    held = leases(conn, "rc-fork")
    hold_run(holder, run_id)
    assert complete(conn, held[(run_id, "y")], 2) == "completed"
    assert rechecks(conn, "rc-fork") == [(held[(run_id, "y")][0], run_id)]
    holder.rollback()

    fork_id = value(conn, "select treadle.fork_run(%s, 'join')", (run_id,))
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (fork_id,)) == {"y": 2}
    assert jobs_per_step(conn, "rc-fork") == {(run_id, "x"): 1, (run_id, "y"): 1, (fork_id, "x"): 1}
    # the source is as it was: its re-check moves it at the next claim
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {}
    assert rechecks(conn, "rc-fork") == [(held[(run_id, "y")][0], run_id)]


def test_a_retried_run_has_the_result_of_a_step_left_for_a_recheck(connect: Connect) -> None:
    """x failed for good while y completed: y's finish found the run row held by x's and
    left a re-check. retry_run takes y's result at once (y does not run again) and the join
    starts as soon as x completes."""
    failer, conn = connect(autocommit=False), connect()
    run_id = value(
        conn,
        "select treadle.start_workflow('fan', '{}', steps => array['x', 'y', 'join'], queue => 'rc-retry',"
        ' max_attempts => 1, after => \'{"join": ["x", "y"]}\')',
    )
    held = leases(conn, "rc-retry")
    failer.execute("select treadle.fail(%s, %s, 'boom', retryable => false)", held[(run_id, "x")])
    assert complete(conn, held[(run_id, "y")], 2) == "completed"
    failer.commit()
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "failed"
    assert rechecks(conn, "rc-retry") == [(held[(run_id, "y")][0], run_id)]

    assert value(conn, "select treadle.retry_run(%s)", (run_id,)) == "running"
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {"y": 2}
    states = conn.execute("select step, state from treadle.jobs where workflow_run_id = %s order by id", (run_id,))
    assert states.fetchall() == [("x", "available"), ("y", "completed")]
    x_again = leases(conn, "rc-retry")
    assert list(x_again) == [(run_id, "x")]
    complete(conn, x_again[(run_id, "x")], 1)
    assert jobs_per_step(conn, "rc-retry") == {(run_id, "x"): 1, (run_id, "y"): 1, (run_id, "join"): 1}
    assert rechecks(conn, "rc-retry") == []
