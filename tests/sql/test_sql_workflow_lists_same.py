"""A batch's list steps moved together (treadle._advance_lists) leave what the same steps
finished one at a time leave: each scenario is built the same way in two databases cloned
from one template (so every id matches), its running jobs are finished by one call each in
one database and by a single call in the other, and the tables are compared row by row
(a job by everything but its id, which the order of its insert decides), with the
notifications each database sent."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import value

NOW = "2999-01-01 12:00:00+00"
TOKEN = uuid.UUID("00000000-0000-4000-8000-000000000001")
QUEUE = "same"

# What a table holds, without what differs between two databases that did the same
# things: ids drawn in another order, the transaction ids.
SNAPSHOT = {
    "jobs": "select to_jsonb(j) - 'id' - 'next_id' - 'ready_txid' from treadle.jobs as j",
    "workflow_runs": "select to_jsonb(r) from treadle.workflow_runs as r",
    "job_history": "select to_jsonb(h) - 'id' - 'next_id' - 'ready_txid' from treadle.job_history as h",
    "workflow_signals": "select to_jsonb(s) from treadle.workflow_signals as s",
    "key_slots": "select to_jsonb(k) from treadle.key_slots as k",
    "queues": "select to_jsonb(q) from treadle.queues as q",
}

# how often treadle._advance_run ran (the deferred moves after a claim call it again)
BY_RUN = (
    "select coalesce(sum(calls), 0) from pg_stat_xact_user_functions"
    " where schemaname = 'treadle' and funcname = '_advance_run'"
)

Setup = Callable[[psycopg.Connection], list[tuple[int, Any]]]


def claim_all(conn: psycopg.Connection) -> list[int]:
    rows = conn.execute(
        "select id from treadle.claim('w', array[%s], batch => 100, lease_token => %s) order by id", (QUEUE, TOKEN)
    ).fetchall()
    return [r[0] for r in rows]


def job_of(conn: psycopg.Connection, run_id: int, step: str) -> int:
    found = conn.execute(
        "select id from treadle.jobs where workflow_run_id = %s and step = %s order by id desc limit 1", (run_id, step)
    ).fetchone()
    assert found is not None
    job_id: int = found[0]
    return job_id


def start(conn: psycopg.Connection, steps: list[str], **options: Any) -> int:
    names = ", ".join(f"{k} => %({k})s" for k in options)
    found = conn.execute(
        f"select treadle.start_workflow('lin', steps => %(steps)s, queue => %(queue)s{', ' + names if names else ''})",
        {"steps": steps, "queue": QUEUE, **options},
    ).fetchone()
    assert found is not None
    run_id: int = found[0]
    return run_id


def lists(conn: psycopg.Connection) -> list[tuple[int, Any]]:
    """List runs at their first, a middle and their last step; meta, priority and
    max_attempts that their next steps copy; a large result; a plain job among them."""
    first = start(conn, ["a", "b", "c"], meta=json.dumps({"trace": "t"}), priority=3, max_attempts=4)
    middle = start(conn, ["a", "b", "c"])
    last = start(conn, ["a"])
    conn.execute("select treadle.enqueue('plain', queue => %s)", (QUEUE,))
    claim_all(conn)
    conn.execute("select treadle.complete(%s, %s)", (job_of(conn, middle, "a"), TOKEN))
    claim_all(conn)
    big = {"blob": "x" * 200_000}
    rows = [(job_of(conn, first, "a"), {"n": 1}), (job_of(conn, middle, "b"), big), (job_of(conn, last, "a"), None)]
    plain = value(conn, "select id from treadle.jobs where name = 'plain'")
    return sorted([*rows, (plain, {"plain": True})])


def others(conn: psycopg.Connection) -> list[tuple[int, Any]]:
    """Steps the batch path leaves to treadle._advance_run, beside list steps it moves:
    a run with step options, a run with compensations, a graph's step, a run whose
    cancel was asked while its step ran, and a list child run's last step (its parent,
    a graph, moves on)."""
    conn.execute("select treadle.define_workflow('kid', array['k1'])")
    options = start(conn, ["a", "b"], step_options=json.dumps({"b": {"priority": 7}}))
    keyed = start(conn, ["a", "b"], step_options=json.dumps({"a": {"concurrency_key": "k"}}))
    undo = start(conn, ["a", "b"], compensations=json.dumps({"a": "undo_a"}))
    graph = start(conn, ["g1", "g2", "g3"], after=json.dumps({"g1": [], "g2": [], "g3": ["g1", "g2"]}))
    stopped = start(conn, ["a", "b"])
    parent = start(
        conn,
        ["p1", "c", "p2"],
        after=json.dumps({"p1": [], "c": [], "p2": ["c"]}),
        children=json.dumps({"c": {"workflow": "kid"}}),
    )
    plain = start(conn, ["a", "b"])
    claim_all(conn)
    conn.execute("select treadle.cancel_workflow(%s)", (stopped,))
    child = value(conn, "select id from treadle.workflow_runs where parent_run_id = %s", (parent,))
    rows = [
        (job_of(conn, options, "a"), 1),
        (job_of(conn, keyed, "a"), 8),
        (job_of(conn, undo, "a"), 2),
        (job_of(conn, graph, "g1"), 3),
        (job_of(conn, stopped, "a"), 4),
        (job_of(conn, parent, "p1"), 5),
        (job_of(conn, child, "k1"), 6),
        (job_of(conn, plain, "a"), 7),
    ]
    return sorted(rows)


def cancelled_parent(conn: psycopg.Connection) -> list[tuple[int, Any]]:
    """A graph whose step was asked to cancel, finished in the batch before its list child's
    last step: one at a time, the step cancels the parent first, and the child's end then
    starts nothing in it; the batch must not start the step after the child either. The
    parent's cancel cancels its child as cancel_workflow does: one at a time the child's
    running last step is asked to stop and ends cancelled, in the batch it completed in the
    same statement, before any run moved (compared apart: the_child_step)."""
    conn.execute("select treadle.define_workflow('kid2', array['k1', 'k2'])")
    parent = start(
        conn,
        ["p1", "c", "p2"],
        after=json.dumps({"p1": [], "c": [], "p2": ["c"]}),
        children=json.dumps({"c": {"workflow": "kid2"}}),
    )
    child = value(conn, "select id from treadle.workflow_runs where parent_run_id = %s", (parent,))
    other = start(conn, ["x", "y"])
    claim_all(conn)
    conn.execute("select treadle.complete(%s, %s)", (job_of(conn, child, "k1"), TOKEN))
    claim_all(conn)  # the child's last step, after the parent's step
    conn.execute("select treadle.cancel(%s)", (job_of(conn, parent, "p1"),))
    rows = [(job_of(conn, parent, "p1"), None), (job_of(conn, other, "x"), None), (job_of(conn, child, "k2"), {"k": 2})]
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    return rows


def not_running(conn: psycopg.Connection) -> list[tuple[int, Any]]:
    """Steps of runs that are not running: one cancelled while its step ran, one failed
    and compensating (its compensation's job completes), with a list step that moves."""
    gone = start(conn, ["a", "b"])
    undo = start(conn, ["a", "b"], compensations=json.dumps({"a": "undo_a"}), max_attempts=1)
    plain = start(conn, ["a", "b"])
    claim_all(conn)
    conn.execute("select treadle.complete(%s, %s)", (job_of(conn, undo, "a"), TOKEN))
    claim_all(conn)
    conn.execute("select treadle.fail(%s, %s, 'no')", (job_of(conn, undo, "b"), TOKEN))
    assert conn.execute("select state from treadle.workflow_runs where id = %s", (undo,)).fetchone() == (
        "compensating",
    )
    claim_all(conn)
    conn.execute(
        "update treadle.workflow_runs set state = 'cancelled', finished_at = treadle.now() where id = %s", (gone,)
    )
    rows = [(job_of(conn, gone, "a"), 1), (job_of(conn, undo, "undo_a"), 2), (job_of(conn, plain, "a"), 3)]
    return sorted(rows)


def duplicate(conn: psycopg.Connection) -> list[tuple[int, Any]]:
    """A job given twice (the second is a repeat of the first) beside another run's step."""
    first, second = start(conn, ["a", "b"]), start(conn, ["a", "b"])
    claim_all(conn)
    a, b = job_of(conn, first, "a"), job_of(conn, second, "a")
    return [(a, {"n": 1}), (a, {"n": 1}), (b, {"n": 2})]


def at_the_bound(conn: psycopg.Connection) -> list[tuple[int, Any]]:
    """Results of exactly the payload limit (1 MiB), the run's next step and its last."""
    first, last = start(conn, ["a", "b"]), start(conn, ["a"])
    claim_all(conn)
    overhead = value(conn, "select pg_column_size(jsonb_build_object('blob', ''))")
    result = {"blob": "x" * (1048576 - overhead)}
    size = value(conn, "select pg_column_size(%s::jsonb)", (json.dumps(result),))
    assert size == 1048576
    return sorted([(job_of(conn, first, "a"), result), (job_of(conn, last, "a"), result)])


SCENARIOS: dict[str, Setup] = {
    "lists": lists,
    "others": others,
    "cancelled_parent": cancelled_parent,
    "not_running": not_running,
    "duplicate": duplicate,
    "at_the_bound": at_the_bound,
}

FINISH = {
    "complete_many": "select count(*) from treadle.complete_many(%s, %s, %s)",
    # batch 1 from a queue that holds nothing: the finish as a worker's cycle runs it
    "complete_and_claim": "select count(*)"
    " from treadle.complete_and_claim(%s, %s, %s, 'w', array['empty'], batch => 1)",
}


def the_child_step(alone: dict[str, list[str]], together: dict[str, list[str]]) -> None:
    """cancelled_parent: the child's last step (k2) ends cancelled one at a time (the
    parent's cancel reached it first) and completed in the batch; both runs are cancelled
    either way, and the parent's step after the child never starts. The rest is compared
    as for every scenario."""
    for snap, state in ((alone, "cancelled"), (together, "completed")):
        rows = [json.loads(r) for r in snap["jobs"]]
        assert [r["state"] for r in rows if r["step"] == "k2"] == [state]
        assert not [r for r in rows if r["step"] == "p2"]
        assert sorted(json.loads(r)["state"] for r in snap["workflow_runs"]) == ["cancelled", "cancelled", "running"]
        snap["jobs"] = [r for r in snap["jobs"] if json.loads(r)["step"] != "k2"]


def snapshot(conn: psycopg.Connection) -> dict[str, list[str]]:
    return {
        table: sorted(json.dumps(r[0], sort_keys=True) for r in conn.execute(sql).fetchall())
        for table, sql in SNAPSHOT.items()
    }


def finish(
    dsn: str, setup: Setup, finish_sql: str, one_at_a_time: bool, citus_path: bool = False
) -> tuple[dict[str, list[str]], set[Any], int]:
    """The tables and the notifications after the finish, and how many steps
    treadle._advance_run moved one by one. citus_path: the finish takes the paths a
    distributed database takes (the session says Citus is loaded and treadle's tables
    distributed, as treadle._distributed remembers it)."""
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as listener:
        conn.execute("select set_config('treadle.now', %s, false), set_config('track_functions', 'all', false)", (NOW,))
        rows = setup(conn)
        listener.execute("listen treadle_jobs")
        listener.execute("listen treadle_done")
        list(listener.notifies(timeout=0.2))  # what the setup told
        if citus_path:
            conn.execute(
                "select set_config('citus.version', '13.2', false), set_config('treadle.distributed', 'on', false)"
            )
        batches = [[r] for r in rows] if one_at_a_time else [rows]
        by_run = 0
        for batch in batches:
            ids = [j for j, _ in batch]
            results = [Jsonb(r) for _, r in batch]
            with conn.transaction():
                # (a session's counts not yet flushed to the shared stats count in the view too)
                before = value(conn, BY_RUN)
                conn.execute(finish_sql, (ids, [TOKEN] * len(ids), results))
                by_run += value(conn, BY_RUN) - before
        told = {(n.channel, n.payload) for n in listener.notifies(timeout=0.5)}
        return snapshot(conn), told, by_run


@pytest.mark.parametrize("finish_with", sorted(FINISH))
@pytest.mark.parametrize(
    "scenario",
    [
        "lists",
        "others",
        "cancelled_parent",
        "not_running",
        "duplicate",
        "at_the_bound",
    ],
)
def test_a_batch_leaves_what_its_steps_one_at_a_time_leave(
    new_database: Callable[..., str], scenario: str, finish_with: str
) -> None:
    setup = SCENARIOS[scenario]
    one, batch = new_database(), new_database()
    alone, alone_told, alone_by_run = finish(one, setup, FINISH[finish_with], one_at_a_time=True)
    together, together_told, together_by_run = finish(batch, setup, FINISH[finish_with], one_at_a_time=False)
    # (the batch took treadle._advance_lists for some of its steps)
    assert together_by_run < alone_by_run or scenario == "cancelled_parent"
    if scenario == "cancelled_parent":
        the_child_step(alone, together)
    for table in SNAPSHOT:
        assert together[table] == alone[table], table
    assert together_told == alone_told


@pytest.mark.parametrize("scenario", ["lists", "others", "cancelled_parent", "not_running"])
def test_on_the_citus_path_a_batch_moves_each_step_alone_and_tells_of_the_steps_its_claim_left(
    new_database: Callable[..., str], scenario: str
) -> None:
    """Where treadle's tables are distributed, treadle._follow_up moves every step by
    treadle._advance_run, and complete_and_claim's treadle._notify_left_steps looks each
    step up alone (Citus pushes no correlated subquery with a LIMIT down to the shards)."""
    setup, finish_sql = SCENARIOS[scenario], FINISH["complete_and_claim"]
    one, batch = new_database(), new_database()
    alone, alone_told, alone_by_run = finish(one, setup, finish_sql, one_at_a_time=True)
    together, together_told, together_by_run = finish(batch, setup, finish_sql, one_at_a_time=False, citus_path=True)
    if scenario == "cancelled_parent":
        the_child_step(alone, together)
    else:
        assert together_by_run == alone_by_run
    for table in SNAPSHOT:
        assert together[table] == alone[table], table
    assert together_told == alone_told
