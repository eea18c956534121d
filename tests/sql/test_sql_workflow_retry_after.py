"""Retrying a run and its steps after the paths that end it other than a failed step job:
a signal wait that timed out waits again, with its whole timeout (it stayed marked timed
out and never timed out again, the run waiting for ever); a step of a run that undoes its
steps (compensating, compensated, or failed in a compensation after another completed) is
not retried (it ran again beside or after the compensations), and a run whose child run
undid its steps is refused by retry_run (it was left running for ever)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, row, value

START = "2999-01-01 12:00:00+00"
WAITS = Jsonb({"approve": {"signal": "go", "timeout": "1 hour"}, "audit": {"signal": "audited", "timeout": "3 days"}})


def at(conn: psycopg.Connection, time: str) -> None:
    conn.execute("set timezone = 'UTC'")
    conn.execute("select set_config('treadle.now', %s, false)", (time,))


def run_row(conn: psycopg.Connection, run_id: int) -> tuple[Any, ...]:
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
        ' after => \'{"ship": ["approve", "audit"]}\', waits => %s)',
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
    assert (
        value(conn, "select state from treadle.workflow_run_steps where run_id = %s and step = 'approve'", (run_id,))
        == "waiting"
    )

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
        ' waits => \'{"approve": {"signal": "go", "timeout": "1 hour"}}\')',
    )
    at(conn, "2999-01-01 13:00:00+00")
    value(conn, "select treadle.rescue()")
    assert run_row(conn, run_id)[0] == "failed"
    assert value(conn, "select treadle.retry_run(%s)", (run_id,)) == "running"
    assert (
        value(conn, "select state from treadle.workflow_run_steps where run_id = %s and step = 'approve'", (run_id,))
        == "waiting"
    )
    assert value(conn, "select treadle.signal(%s, 'go', '{\"n\": 1}')", (run_id,)) == "delivered"
    assert value(conn, "select results from treadle.workflow_runs where id = %s", (run_id,)) == {"approve": {"n": 1}}
    assert conn.execute("select step, state from treadle.jobs where workflow_run_id = %s", (run_id,)).fetchall() == [
        ("ship", "available")
    ]


def claim(conn: psycopg.Connection, queue: str) -> tuple[int, str, str]:
    """Claim one job of `queue`: (id, lease token, step)."""
    job_id, token, step = row(conn, "select id, lease_token, step from treadle.claim('w', array[%s])", (queue,))
    return job_id, token, step


def start_withdrawal(conn: psycopg.Connection, queue: str) -> tuple[int, int]:
    """A run whose reserve completed and whose send failed for good: (run id, send's job id)."""
    run_id = value(
        conn,
        "select treadle.start_workflow('withdrawal', steps => array['reserve', 'send', 'settle'], queue => %s,"
        ' max_attempts => 1, compensations => \'{"reserve": "release"}\')',
        (queue,),
    )
    job_id, token, _ = claim(conn, queue)
    conn.execute("select treadle.complete(%s, %s, '{\"hold\": 7}')", (job_id, token))
    send_id, token, step = claim(conn, queue)
    assert step == "send"
    conn.execute("select treadle.fail(%s, %s, 'the bank refused', retryable => false)", (send_id, token))
    return run_id, send_id


def states(conn: psycopg.Connection, run_id: int) -> list[tuple[str, str]]:
    return conn.execute(
        "select step, state from treadle.jobs where workflow_run_id = %s order by id", (run_id,)
    ).fetchall()


def test_a_step_of_a_run_that_compensates_or_was_compensated_is_not_retried(connect: Connect) -> None:
    conn = connect()
    run_id, send_id = start_withdrawal(conn, "undo")
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "compensating"
    # while its compensation waits: send would run beside it
    assert value(conn, "select treadle.retry(%s)", (send_id,)) is False
    assert states(conn, run_id) == [("reserve", "completed"), ("send", "discarded"), ("release", "available")]

    job_id, token, step = claim(conn, "undo")
    assert step == "release"
    conn.execute("select treadle.complete(%s, %s, '\"released\"')", (job_id, token))
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "compensated"
    # once compensated: send would run after its reservation was released
    assert value(conn, "select treadle.retry(%s)", (send_id,)) is False
    assert states(conn, run_id) == [("reserve", "completed"), ("send", "discarded"), ("release", "completed")]
    assert value(conn, "select count(*) from treadle.claim('w', array['undo'])") == 0


def test_a_step_of_a_run_that_failed_in_a_compensation_after_another_is_not_retried(connect: Connect) -> None:
    """settle fails; recall (send's) completes, release (reserve's) fails for good: the run
    failed with send undone, so settle does not run again, and retry_run retries release."""
    conn = connect()
    run_id = value(
        conn,
        "select treadle.start_workflow('withdrawal', steps => array['reserve', 'send', 'settle'],"
        " queue => 'undo-failed', max_attempts => 1,"
        ' compensations => \'{"reserve": "release", "send": "recall"}\')',
    )
    for expected, result in (("reserve", "{}"), ("send", "{}"), ("settle", None), ("recall", "{}"), ("release", None)):
        job_id, token, step = claim(conn, "undo-failed")
        assert step == expected
        if result is None:
            conn.execute("select treadle.fail(%s, %s, 'boom', retryable => false)", (job_id, token))
        else:
            conn.execute("select treadle.complete(%s, %s, %s::jsonb)", (job_id, token, result))
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "failed"
    settle_id = value(conn, "select id from treadle.jobs where workflow_run_id = %s and step = 'settle'", (run_id,))
    assert value(conn, "select treadle.retry(%s)", (settle_id,)) is False
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "failed"
    assert value(conn, "select treadle.retry_run(%s)", (run_id,)) == "compensating"
    assert states(conn, run_id) == [
        ("reserve", "completed"),
        ("send", "completed"),
        ("settle", "discarded"),
        ("recall", "completed"),
        ("release", "available"),
    ]


def test_a_cancelled_run_with_compensations_is_still_retried_from_its_step(connect: Connect) -> None:
    conn = connect()
    run_id = value(
        conn,
        "select treadle.start_workflow('withdrawal', steps => array['reserve', 'send'], queue => 'undo-cancel',"
        ' compensations => \'{"reserve": "release"}\')',
    )
    job_id = value(conn, "select id from treadle.jobs where workflow_run_id = %s", (run_id,))
    assert value(conn, "select treadle.cancel_workflow(%s)", (run_id,)) is True
    assert value(conn, "select treadle.retry(%s)", (job_id,)) is True  # nothing was undone
    assert value(conn, "select state from treadle.workflow_runs where id = %s", (run_id,)) == "running"


def test_a_run_whose_child_run_was_compensated_is_not_retried_but_forked(connect: Connect) -> None:
    """The child's capture fails, its compensation undoes authorize, and the parent fails:
    a retry would leave the parent running for ever, its child step waiting for a child
    that never completes."""
    conn = connect()
    conn.execute(
        "select treadle.define_workflow('charge', array['authorize', 'capture'],"
        ' compensations => \'{"authorize": "void"}\')'
    )
    run_id = value(
        conn,
        "select treadle.start_workflow('order', steps => array['pay', 'ship'], queue => 'orders', max_attempts => 1,"
        ' children => \'{"pay": {"workflow": "charge", "queue": "charges"}}\')',
    )
    child_id = value(conn, "select id from treadle.workflow_runs where parent_run_id = %s", (run_id,))
    for expected, result in (("authorize", "{}"), ("capture", None), ("void", "{}")):
        job_id, token, step = claim(conn, "charges")
        assert step == expected
        if result is None:
            conn.execute("select treadle.fail(%s, %s, 'declined', retryable => false)", (job_id, token))
        else:
            conn.execute("select treadle.complete(%s, %s, %s::jsonb)", (job_id, token, result))
    runs = "select id, state from treadle.workflow_runs where id in (%s, %s) order by id"
    assert conn.execute(runs, (run_id, child_id)).fetchall() == [(run_id, "failed"), (child_id, "compensated")]

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"child run {child_id} that is compensated"):
        conn.execute("select treadle.retry_run(%s)", (run_id,))
    assert conn.execute(runs, (run_id, child_id)).fetchall() == [(run_id, "failed"), (child_id, "compensated")]

    fork_id = value(conn, "select treadle.fork_run(%s, 'pay')", (run_id,))
    assert value(conn, "select state from treadle.workflow_runs where parent_run_id = %s", (fork_id,)) == "running"


def test_a_step_of_a_child_run_whose_sibling_was_compensated_is_not_retried(connect: Connect) -> None:
    """pay's child (charge) is compensated and fails the parent; insure's child (policy)
    fails too. A retry of the policy's step, or of the policy run, would resume the parent,
    which then waits for ever for pay's child: both are refused, and nothing changes."""
    conn = connect()
    conn.execute(
        "select treadle.define_workflow('charge', array['authorize', 'capture'],"
        ' compensations => \'{"authorize": "void"}\')'
    )
    conn.execute("select treadle.define_workflow('policy', array['quote', 'bind'])")
    run_id = value(
        conn,
        "select treadle.start_workflow('order', steps => array['pay', 'insure', 'ship'], queue => 'orders2',"
        ' max_attempts => 1, after => \'{"ship": ["pay", "insure"]}\','
        ' children => \'{"pay": {"workflow": "charge", "queue": "charges2"},'
        ' "insure": {"workflow": "policy", "queue": "policies2"}}\')',
    )
    charge_id, policy_id = (
        r[0]
        for r in conn.execute(
            "select id from treadle.workflow_runs where parent_run_id = %s order by parent_step = 'insure'", (run_id,)
        ).fetchall()
    )
    for expected, result in (("authorize", "{}"), ("capture", None), ("void", "{}")):
        job_id, token, step = claim(conn, "charges2")
        assert step == expected
        if result is None:
            conn.execute("select treadle.fail(%s, %s, 'declined', retryable => false)", (job_id, token))
        else:
            conn.execute("select treadle.complete(%s, %s, %s::jsonb)", (job_id, token, result))
    quote_id, token, step = claim(conn, "policies2")
    assert step == "quote"
    conn.execute("select treadle.fail(%s, %s, 'no quote', retryable => false)", (quote_id, token))
    runs = "select id, state from treadle.workflow_runs where id in (%s, %s, %s) order by id"
    before = [(run_id, "failed"), (charge_id, "compensated"), (policy_id, "failed")]
    assert conn.execute(runs, (run_id, charge_id, policy_id)).fetchall() == before

    assert value(conn, "select treadle.retry(%s)", (quote_id,)) is False
    assert conn.execute(runs, (run_id, charge_id, policy_id)).fetchall() == before
    assert value(conn, "select state from treadle.jobs where id = %s", (quote_id,)) == "discarded"
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"run {charge_id} that is compensated") as e:
        conn.execute("select treadle.retry_run(%s)", (policy_id,))
    assert e.value.diag.message_hint is not None and "fork_run" in e.value.diag.message_hint
    assert conn.execute(runs, (run_id, charge_id, policy_id)).fetchall() == before
    assert value(conn, "select state from treadle.jobs where id = %s", (quote_id,)) == "discarded"


def test_the_top_of_a_run_tree_is_the_root_each_child_run_names(connect: Connect) -> None:
    """A grandchild's tree is its top run's, read from the root it names: also once the run
    between them is gone (removed by hand), where a walk up the parents would stop short."""
    conn = connect()
    conn.execute("select treadle.define_workflow('leaf', array['work'])")
    conn.execute(
        "select treadle.define_workflow('branch', array['split'],"
        ' children => \'{"split": {"workflow": "leaf", "queue": "leaves"}}\')'
    )
    top = value(
        conn,
        "select treadle.start_workflow('trunk', steps => array['grow'], queue => 'trunks',"
        ' children => \'{"grow": {"workflow": "branch", "queue": "branches"}}\')',
    )
    middle = value(conn, "select id from treadle.workflow_runs where parent_run_id = %s", (top,))
    leaf = value(conn, "select id from treadle.workflow_runs where parent_run_id = %s", (middle,))
    assert leaf is not None
    roots = "select treadle._root_run(%s), treadle._root_run(%s), treadle._root_run(%s), treadle._root_run(-1)"
    assert row(conn, roots, (top, middle, leaf)) == (top, top, top, None)
    conn.execute("delete from treadle.jobs where workflow_run_id = %s", (middle,))
    conn.execute("delete from treadle.workflow_runs where id = %s", (middle,))
    assert row(conn, roots, (top, middle, leaf)) == (top, None, top, None)
