"""A signal wait's timeout holds on treadle's clock whether or not a rescue has run since:
a signal sent once the timeout passed is ignored (it was delivered until a rescue timed the
wait out, so with no worker running a 1-hour wait took a signal hours late), and the
rescue then takes the timeout path."""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, row, value


def at(conn: psycopg.Connection, time: str) -> None:
    conn.execute("select set_config('treadle.now', %s, false)", (time,))


def start(conn: psycopg.Connection, waits: dict[str, object]) -> int:
    at(conn, "2999-01-01 12:00:00+00")
    run_id: int = value(
        conn,
        "select treadle.start_workflow('gate', steps => array['approve', 'ship'], queue => 'deadline', waits => %s)",
        (Jsonb(waits),),
    )
    return run_id


def test_a_signal_after_the_timeout_is_ignored_and_the_run_fails_at_the_next_rescue(connect: Connect) -> None:
    conn = connect()
    run_id = start(conn, {"approve": {"signal": "go", "timeout": "1 hour"}})
    at(conn, "2999-01-01 12:59:59+00")
    before = row(conn, "select results, waiting from treadle.workflow_runs where id = %s", (run_id,))
    at(conn, "2999-01-01 15:00:00+00")  # no rescue ran meanwhile
    assert value(conn, "select treadle.signal(%s, 'go', '{\"late\": true}')", (run_id,)) == "ignored"
    assert row(conn, "select results, waiting from treadle.workflow_runs where id = %s", (run_id,)) == before
    assert value(conn, "select count(*) from treadle.workflow_signals") == 0
    value(conn, "select treadle.rescue()")
    assert row(conn, "select state, finished_at::text from treadle.workflow_runs where id = %s", (run_id,)) == (
        "failed",
        "2999-01-01 15:00:00+00",
    )


def test_a_signal_just_before_the_timeout_is_delivered(connect: Connect) -> None:
    conn = connect()
    run_id = start(conn, {"approve": {"signal": "go", "timeout": "1 hour"}})
    at(conn, "2999-01-01 12:59:59.999999+00")
    assert value(conn, "select treadle.signal(%s, 'go')", (run_id,)) == "delivered"


def test_a_late_signal_leaves_a_continuing_wait_to_its_timeout_path(connect: Connect) -> None:
    conn = connect()
    run_id = start(conn, {"approve": {"signal": "go", "timeout": "1 hour", "on_timeout": "continue"}})
    at(conn, "2999-01-01 13:00:00+00")
    assert value(conn, "select treadle.signal(%s, 'go', '{\"by\": \"ann\"}')", (run_id,)) == "ignored"
    value(conn, "select treadle.rescue()")
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {
        "approve": {"timed_out": True}
    }
