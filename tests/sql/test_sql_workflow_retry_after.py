"""Retrying a run after the paths that end it other than a failed step job: a signal wait
that timed out waits again, with its whole timeout (it stayed marked timed out and never
timed out again, the run waiting for ever)."""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, row, value

START = "2999-01-01 12:00:00+00"
WAITS = Jsonb({"approve": {"signal": "go", "timeout": "1 hour"}, "audit": {"signal": "audited", "timeout": "3 days"}})


def at(conn: psycopg.Connection, time: str) -> None:
    conn.execute("set timezone = 'UTC'")
    conn.execute("select set_config('treadle.now', %s, false)", (time,))


def run_row(conn: psycopg.Connection, run_id: int) -> tuple[object, ...]:
    return row(
        conn,
        "select state, waiting, wait_until::text from treadle.workflow_runs where id = %s",
        (run_id,),
    )


def test_a_retried_run_waits_again_for_the_signal_whose_timeout_failed_it(connect: Connect) -> None:
    conn = connect()
    at(conn, START)
    run_id = value(
        conn,
        "select treadle.start_workflow('gate', steps => array['approve', 'audit', 'ship'], queue => 'gate',"
        " after => '{\"ship\": [\"approve\", \"audit\"]}', waits => %s)",
        (WAITS,),
    )
    at(conn, "2999-01-01 13:00:00+00")
    value(conn, "select treadle.rescue()")
    assert run_row(conn, run_id)[0] == "failed"  # approve timed out; audit still waited

    at(conn, "2999-01-01 14:00:00+00")
    assert value(conn, "select treadle.retry_run(%s)", (run_id,)) == "running"
    state, waiting, wait_until = run_row(conn, run_id)
    assert waiting == {
        "approve": {"signal": "go", "until": "2999-01-01T15:00:00+00:00"},  # the whole hour from the retry
        "audit": {"signal": "audited", "until": "2999-01-04T12:00:00+00:00"},  # as before
    }
    assert wait_until == "2999-01-01 15:00:00+00"
    assert value(
        conn, "select state from treadle.workflow_run_steps where run_id = %s and step = 'approve'", (run_id,)
    ) == "waiting"

    # it times out again at its new time, never before
    at(conn, "2999-01-01 14:59:59+00")
    value(conn, "select treadle.rescue()")
    assert run_row(conn, run_id)[0] == "running"
    at(conn, "2999-01-01 15:00:00+00")
    value(conn, "select treadle.rescue()")
    assert run_row(conn, run_id)[0] == "failed"

    # retried once more, its signal completes it, and the other wait's timeout still holds
    at(conn, "2999-01-01 16:00:00+00")
    assert value(conn, "select treadle.retry_run(%s)", (run_id,)) == "running"
    assert value(conn, "select treadle.signal(%s, 'go', '{\"by\": \"ann\"}')", (run_id,)) == "delivered"
    at(conn, "2999-01-04 12:00:00+00")
    value(conn, "select treadle.rescue()")
    state, waiting, wait_until = run_row(conn, run_id)
    assert (state, wait_until) == ("failed", None)
    assert waiting["audit"]["timed_out"] is True


def test_a_signal_after_the_retry_completes_the_wait_that_timed_out(connect: Connect) -> None:
    conn = connect()
    at(conn, START)
    run_id = value(
        conn,
        "select treadle.start_workflow('gate', steps => array['approve', 'ship'], queue => 'gate-kept',"
        " waits => '{\"approve\": {\"signal\": \"go\", \"timeout\": \"1 hour\"}}')",
    )
    at(conn, "2999-01-01 13:00:00+00")
    value(conn, "select treadle.rescue()")
    assert run_row(conn, run_id)[0] == "failed"
    assert value(conn, "select treadle.retry_run(%s)", (run_id,)) == "running"
    assert value(
        conn, "select state from treadle.workflow_run_steps where run_id = %s and step = 'approve'", (run_id,)
    ) == "waiting"
    assert value(conn, "select treadle.signal(%s, 'go', '{\"n\": 1}')", (run_id,)) == "delivered"
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {"approve": {"n": 1}}
    assert conn.execute(
        "select step, state from treadle.jobs where workflow_run_id = %s", (run_id,)
    ).fetchall() == [("ship", "available")]
