"""Re-checks that cannot be done hold up no other (073_workflow_rechecks.sql).

A cancelled step's re-check stays while a long transaction holds a job of its run's tree
(073_workflow_cancel_rechecks.sql). A claim moves at most 100 re-checks of its queues,
oldest first: stuck ones that kept their first place would fill every claim's batch, and
a newer re-check (a join whose run another session held for a moment) would wait behind
them as long as that transaction lasts. A re-check that stays does not count toward the
batch, and goes to the back of the line.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, value

QUEUE = "stuck-rechecks"
FAN = Jsonb({"a": [], "b": [], "c": ["a", "b"]})
STUCK = 150  # over a claim's batch of 100 re-checks


def start(conn: psycopg.Connection, count: int) -> list[int]:
    rows = conn.execute(
        "select treadle.start_workflow('fan', '{}', steps => array['a', 'b', 'c'], queue => %s, after => %s)"
        "  from generate_series(1, %s)",
        (QUEUE, FAN, count),
    ).fetchall()
    return [int(r[0]) for r in rows]


def claim(conn: psycopg.Connection) -> dict[tuple[int, str], tuple[int, Any]]:
    rows = conn.execute(
        "select workflow_run_id, step, id, lease_token from treadle.claim('w', array[%s], batch => 1000)", (QUEUE,)
    ).fetchall()
    return {(run_id, step): (job_id, token) for run_id, step, job_id, token in rows}


def test_a_fresh_re_check_is_done_by_the_next_claim_behind_stuck_ones(connect: Connect) -> None:
    setup = connect()
    stuck = start(setup, STUCK)
    jobs = claim(setup)
    # a long transaction holds every b: each a that ends cancelled leaves its run's cancel
    holder = connect(autocommit=False)
    holder.execute("select 1 from treadle.jobs where id = any(%s) for update", ([jobs[(r, "b")][0] for r in stuck],))
    for run_id in stuck:
        assert value(setup, "select treadle.cancel(%s)", (jobs[(run_id, "a")][0],)) is True
        assert value(setup, "select treadle.complete(%s, %s)", jobs[(run_id, "a")]) == "cancelled"
    assert value(setup, "select count(*) from treadle.run_rechecks") == STUCK

    # a fresh re-check: b completes while another session holds its run's row for a moment
    (fresh,) = start(setup, 1)
    fresh_jobs = claim(setup)  # (this claim tries the stuck ones first: none can be done)
    assert value(setup, "select treadle.complete(%s, %s)", fresh_jobs[(fresh, "a")]) == "completed"
    with connect(autocommit=False) as briefly:
        briefly.execute("select 1 from treadle.workflow_runs where id = %s for update", (fresh,))
        assert value(setup, "select treadle.complete(%s, %s)", fresh_jobs[(fresh, "b")]) == "completed"
        briefly.rollback()
    added = value(setup, "select added_at from treadle.run_rechecks where run_id = %s", (fresh,))
    assert added is not None
    assert value(setup, "select count(*) from treadle.run_rechecks") == STUCK + 1

    # the next claim does it, though STUCK older ones come first and stay
    next_claim = claim(setup)
    assert (fresh, "c") in next_claim, "the fresh re-check waited behind re-checks that could not be done"
    assert value(setup, "select count(*) from treadle.run_rechecks where run_id = %s", (fresh,)) == 0
    # the stuck ones went to the back of the line, behind the one just done
    assert value(setup, "select min(added_at) > %s from treadle.run_rechecks", (added,)) is True
    assert value(setup, "select count(*) from treadle.run_rechecks") == STUCK

    # once the long transaction ends they are done too
    holder.rollback()
    setup.execute("select treadle.rescue()")
    assert value(setup, "select count(*) from treadle.run_rechecks") == 0
    assert (
        value(setup, "select count(*) from treadle.workflow_runs where id = any(%s) and state = 'cancelled'", (stuck,))
        == STUCK
    )
