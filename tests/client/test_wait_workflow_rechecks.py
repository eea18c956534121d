"""wait_workflow on a run that a re-check ends (073_workflow_rechecks.sql,
073_workflow_cancel_rechecks.sql): the step's own finish notifies treadle_done while the run
is still running, and the run ends later, in a claim or treadle.rescue, which finishes no job.
That move tells the run's queue's waiters too: a waiter polling once an hour is woken by it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import treadle
from tests.client.producer_support import Background, backend_of, with_app_name
from tests.client.test_wait_workflow import HOUR, until_run_read

QUEUE = "deferred-wait"
FAN = Jsonb({"a": [], "b": [], "c": ["a", "b"]})
FAN_MAP = Jsonb({"a": [], "b": [], "m": ["a", "b"]})


def claim(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, Any]]:
    rows = conn.execute(
        "SELECT step, id, lease_token FROM treadle.claim('w', array[%s], batch => 10)", [QUEUE]
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def waiting(dsn: str, conn: psycopg.Connection[Any], run_id: int, name: str) -> Background:
    waiter = Background(lambda: treadle.wait_workflow(with_app_name(dsn, name), run_id, poll_interval=HOUR))
    until_run_read(conn, backend_of(conn, name))
    return waiter


def woken(waiter: Background) -> Any:
    waiter.thread.join(20)  # (an hour's poll: only a notification ends the wait)
    assert not waiter.thread.is_alive(), "the run ended but its waiter was never woken"
    return waiter.outcome()


def test_a_cancel_left_for_a_re_check_wakes_the_waiter(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = conn.execute(
        "SELECT treadle.start_workflow('fan', steps => array['a', 'b', 'c'], queue => %s, after => %s)", [QUEUE, FAN]
    ).fetchone()[0]  # type: ignore[index]
    jobs = claim(conn)
    assert conn.execute("SELECT treadle.cancel(%s)", [jobs["a"][0]]).fetchone() == (True,)
    # b's job is held (as a finish of it holds it): a's end leaves the run's cancel for later
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM treadle.jobs WHERE id = %s FOR UPDATE", [jobs["b"][0]])
        assert conn.execute("SELECT treadle.complete(%s, %s)", jobs["a"]).fetchone() == ("cancelled",)
        holder.rollback()
    assert conn.execute("SELECT count(*) FROM treadle.run_rechecks WHERE run_id = %s", [run_id]).fetchone() == (1,)
    waiter = waiting(dsn, conn, run_id, "deferred-cancel-waiter")
    conn.execute("SELECT treadle.rescue()")
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone() == ("cancelled",)
    with pytest.raises(treadle.WorkflowCancelled):
        woken(waiter)


def test_a_join_left_for_a_re_check_that_completes_the_run_wakes_the_waiter(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    run_id = conn.execute(
        "SELECT treadle.start_workflow('fan2', steps => array['a', 'b', 'm'], queue => %s, after => %s, maps => %s)",
        [QUEUE, FAN_MAP, Jsonb({"m": "a"})],
    ).fetchone()[0]  # type: ignore[index]
    jobs = claim(conn)
    # a's result is [], so the map m over it completes at once once b's re-check makes it ready,
    # and the run with it
    assert conn.execute("SELECT treadle.complete(%s, %s, %s)", [*jobs["a"], Jsonb([])]).fetchone() == ("completed",)
    # b completes while another session holds the run row: its run moves by a re-check
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM treadle.workflow_runs WHERE id = %s FOR UPDATE", [run_id])
        assert conn.execute("SELECT treadle.complete(%s, %s)", jobs["b"]).fetchone() == ("completed",)
        holder.rollback()
    assert conn.execute("SELECT count(*) FROM treadle.run_rechecks WHERE run_id = %s", [run_id]).fetchone() == (1,)
    waiter = waiting(dsn, conn, run_id, "recheck-join-waiter")
    conn.execute("SELECT treadle.rescue()")
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone() == ("completed",)
    assert sorted(woken(waiter)) == ["a", "b", "m"]
