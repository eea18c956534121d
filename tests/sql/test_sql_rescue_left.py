"""A rescue takes at most 1,000 runs a call in each of its workflow passes (sleeps that end,
signal waits that time out): when one took as many it says so, in the transaction-local
setting treadle.rescue_left, so that a worker calls again at once (sql/src/050_finish.sql)."""

from __future__ import annotations

import psycopg

from tests.sql.sqlcalls import Connect, row, value

RESCUE = "select r.n, coalesce(current_setting('treadle.rescue_left', true), '') from treadle.rescue() as r(n)"
LATER = "select set_config('treadle.now', (now() + interval '2 hours')::text, false)"


def asleep(conn: psycopg.Connection, queue: str) -> int:
    """Workflow runs of `queue` whose sleep has not ended."""
    sql = "select count(*) from treadle.workflow_runs where queue = %s and wakes is not null"
    return int(value(conn, sql, (queue,)))


def test_a_rescue_that_ends_1000_sleeps_says_more_may_be_left(connect: Connect) -> None:
    conn = connect()
    conn.execute(
        "select count(treadle.start_workflow('nap', steps => array['zz', 'wake'], sleeps => '{\"zz\": \"1 hour\"}',"
        " queue => 'left-nap')) from generate_series(1, 1001)"
    )
    assert row(conn, RESCUE) == (0, "")  # not due yet
    conn.execute(LATER)
    assert row(conn, RESCUE) == (0, "on")  # (no job moved: the count is of jobs)
    assert asleep(conn, "left-nap") == 1
    # the setting lasts the rescue's transaction only
    assert value(conn, "select coalesce(current_setting('treadle.rescue_left', true), '')") == ""
    assert row(conn, RESCUE) == (0, "")
    assert asleep(conn, "left-nap") == 0
    assert value(conn, "select count(*) from treadle.jobs where queue = 'left-nap' and name like '%%/wake'") == 1001


def test_a_rescue_that_times_out_1000_waits_says_more_may_be_left(connect: Connect) -> None:
    conn = connect()
    conn.execute(
        "select count(treadle.start_workflow('hark', steps => array['hear'],"
        ' waits => \'{"hear": {"signal": "go", "timeout": "1 hour"}}\', queue => \'left-hark\'))'
        " from generate_series(1, 1001)"
    )
    conn.execute(LATER)
    assert row(conn, RESCUE) == (0, "on")
    assert row(conn, RESCUE) == (0, "")
    failed = "select count(*) from treadle.workflow_runs where queue = 'left-hark' and state = 'failed'"
    assert value(conn, failed) == 1001


def test_a_run_whose_wake_time_is_wrong_is_taken_once(connect: Connect) -> None:
    """A run whose wake_at says due while none of its sleeps is (a row changed by hand) gets
    its wake_at back from its sleeps: 1,000 such runs would otherwise fill every call, and a
    worker would call again at once for ever."""
    conn = connect()
    conn.execute(
        "select count(treadle.start_workflow('nap', steps => array['zz', 'wake'], sleeps => '{\"zz\": \"3 hours\"}',"
        " queue => 'left-wrong')) from generate_series(1, 1000)"
    )
    conn.execute("update treadle.workflow_runs set wake_at = now() where queue = 'left-wrong'")
    conn.execute(LATER)
    assert row(conn, RESCUE) == (0, "on")
    assert row(conn, RESCUE) == (0, "")  # wake_at is the sleeps' again: not due
    assert asleep(conn, "left-wrong") == 1000
    right = (
        "select count(*) from treadle.workflow_runs"
        " where queue = 'left-wrong' and wake_at = (wakes ->> 'zz')::timestamptz"
    )
    assert value(conn, right) == 1000
