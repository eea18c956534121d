"""Run tree bounds through real connections: a chain of workflows five wide at every
level grows one tree by 781 runs when its first child step starts; a tree that this
takes past 10,000 runs refuses the step's completion (54000, program_limit_exceeded)
and keeps nothing of it, and one it takes to 10,000 exactly grows. A step name with
'/' is refused, so two workflows' step jobs never share a name."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, row, value

CAP = 10_000
WIDTH = 5
CHAIN = 1 + 5 + 25 + 125 + 625  # runs of one lvl1 tree: four 5-wide levels over the leaves


def define_chain(conn: psycopg.Connection) -> None:
    """lvl1 .. lvl4 start five runs of the next level each; lvl5 is one plain step."""
    conn.execute("select treadle.define_workflow('lvl5', array['work'])")
    for level in range(4, 0, -1):
        conn.execute(
            """
            select treadle.define_workflow(
                       %(name)s, array_agg('c' || i order by i),
                       after => jsonb_object_agg('c' || i, '[]'::jsonb),
                       children => jsonb_object_agg('c' || i, jsonb_build_object('workflow', %(next)s::text)))
              from generate_series(1, %(width)s::integer) as i
            """,
            {"name": f"lvl{level}", "next": f"lvl{level + 1}", "width": WIDTH},
        )
    conn.execute(
        "select treadle.define_workflow('chain', array['first', 'fan'], children => %s)",
        (Jsonb({"fan": {"workflow": "lvl1"}}),),
    )


def start_with_count(conn: psycopg.Connection, queue: str, tree_runs: int) -> tuple[int, int, str]:
    """A chain run whose tree already counts tree_runs, and its first step claimed: (run, job, token)."""
    run_id: int = value(conn, "select treadle.start_workflow('chain', '{}', queue => %s)", (queue,))
    conn.execute("update treadle.workflow_runs set tree_runs = %s where id = %s", (tree_runs, run_id))
    job_id, token = row(conn, "select id, lease_token from treadle.claim('w', array[%s])", (queue,))
    return run_id, job_id, token


def test_a_five_wide_chain_stops_at_the_cap(connect: Connect) -> None:
    conn = connect()
    define_chain(conn)
    runs_before = value(conn, "select count(*) from treadle.workflow_runs")
    run_id, job_id, token = start_with_count(conn, "bounds-past", CAP - CHAIN + 1)

    with pytest.raises(psycopg.errors.ProgramLimitExceeded) as raised:
        conn.execute("select treadle.complete(%s, %s, '{}')", (job_id, token))
    assert raised.value.sqlstate == "54000"
    assert f"would grow the run tree of workflow run {run_id} past {CAP} runs" in str(raised.value)
    # nothing of the fan-out is kept: no run, no count, and the step is still the worker's
    assert value(conn, "select count(*) from treadle.workflow_runs") == runs_before + 1
    assert row(conn, "select tree_runs from treadle.workflow_runs where id = %s", (run_id,)) == (CAP - CHAIN + 1,)
    assert row(conn, "select state from treadle.jobs where id = %s", (job_id,)) == ("running",)
    assert value(conn, "select count(*) from treadle.jobs where queue = 'bounds-past'") == 1


def test_a_five_wide_chain_grows_to_the_cap_exactly(connect: Connect) -> None:
    conn = connect()
    define_chain(conn)
    run_id, job_id, token = start_with_count(conn, "bounds-at", CAP - CHAIN)

    assert value(conn, "select treadle.complete(%s, %s, '{}')", (job_id, token)) == "completed"
    assert row(conn, "select tree_runs from treadle.workflow_runs where id = %s", (run_id,)) == (CAP,)
    assert value(conn, "select count(*) from treadle.workflow_runs where root_run_id = %s", (run_id,)) == CHAIN
    # every run below names the root, and the leaves' steps wait for workers
    assert value(conn, "select count(*) from treadle.jobs where name = 'workflow:lvl5/work'") == 625


def test_a_step_name_with_a_slash_is_refused(connect: Connect) -> None:
    conn = connect()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r'step "a/b" must not hold'):
        conn.execute("select treadle.define_workflow('w', array['a/b'])")
    conn.execute("select treadle.define_workflow('w/a', array['b'])")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r'step "a/b" must not hold'):
        conn.execute("select treadle.start_workflow('w', '{}', steps => array['a/b'])")
    assert value(conn, "select count(*) from treadle.workflows where name = 'w'") == 0
