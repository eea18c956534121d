"""The trust boundary over 0.4.0's new surface, across sessions: what one tenant's session
can make another tenant's session wait for, and what a setting a session may set by hand
changes for the others."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import as_role
from tests.sql.sqlcalls import Connect, value


def tenant(setup: psycopg.Connection, make_role: Callable[[str], str], purpose: str, prefix: str) -> str:
    """A new login role with the worker part, kept to the queues under prefix."""
    role = make_role(purpose)
    setup.execute("select treadle.grant_worker(%s), treadle.set_tenant(%s, %s)", (role, role, prefix))
    return role


def test_a_tenant_holding_listen_done_open_stalls_no_other_tenant(
    connect: Connect, dsn: str, make_role: Callable[[str], str]
) -> None:
    """listen_done removes the rows of sessions that ended. A tenant that called it and
    keeps its transaction open holds those rows; another tenant's listen_done skips them
    instead of waiting for that transaction (which could last for ever), and still
    registers its session. The rows go at a later call once nobody holds them."""
    setup = connect()
    role_a = tenant(setup, make_role, "t4_wait_a", "a.")
    role_b = tenant(setup, make_role, "t4_wait_b", "b.")
    # a session that registered and ended without unlisten_done leaves its row
    with psycopg.connect(as_role(dsn, role_a), autocommit=True) as gone:
        gone_pid = value(gone, "select pg_backend_pid()")
        assert value(gone, "select treadle.listen_done('a.mail')") is True
    deadline = time.monotonic() + 10
    while (
        value(setup, "select count(*) from pg_stat_activity where pid = %s", (gone_pid,))
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert value(setup, "select count(*) from treadle.done_waiters where pid = %s", (gone_pid,)) == 1

    holder = psycopg.connect(as_role(dsn, role_a), autocommit=False)
    other = psycopg.connect(as_role(dsn, role_b), autocommit=True)
    try:
        holder.execute("select treadle.listen_done('a.mail')")  # removes the row, and stays open
        other.execute("set statement_timeout = '5s'")
        started = time.monotonic()
        try:
            other.execute("select treadle.listen_done('b.mail')")
        except psycopg.errors.QueryCanceled:
            pytest.fail("tenant b's listen_done waited for tenant a's open transaction")
        assert time.monotonic() - started < 2, "tenant b's listen_done waited for tenant a's open transaction"
        other_pid = value(other, "select pg_backend_pid()")
        assert value(setup, "select queue from treadle.done_waiters where pid = %s", (other_pid,)) == "b.mail"
        holder.rollback()  # its removal undone: the row of the ended session is back
        assert value(setup, "select count(*) from treadle.done_waiters where pid = %s", (gone_pid,)) == 1
        other.execute("select treadle.listen_done('b.mail')")
        assert value(setup, "select count(*) from treadle.done_waiters where pid = %s", (gone_pid,)) == 0
        assert value(setup, "select count(*) from treadle.done_waiters where pid = %s", (other_pid,)) == 1
    finally:
        holder.close()
        other.close()


def test_settings_set_by_hand_change_nothing_of_another_tenant(
    connect: Connect, dsn: str, make_role: Callable[[str], str]
) -> None:
    """The treadle.* settings the functions read are the session's own: tenant a, setting
    them by hand (a forged list of written steps naming tenant b's jobs, claim_follows,
    steps_seen, a garbage claim turn, the Citus flag, a rescue cursor, the test clock),
    finishes and claims its own jobs as usual and changes no row of tenant b."""
    setup = connect()
    role_a = tenant(setup, make_role, "t4_guc_a", "a.")
    b_jobs = [value(setup, "select treadle.enqueue('b', queue => 'b.work')") for _ in range(3)]
    b_claimed = value(setup, "select c.id from treadle.claim('w-b', array['b.work']) as c")
    before = setup.execute(
        "select id, state, run_at, lease_token from treadle.jobs where queue = 'b.work' order by id"
    ).fetchall()
    for _ in range(2):
        setup.execute("select treadle.enqueue('a', queue => 'a.work')")

    a = psycopg.connect(as_role(dsn, role_a), autocommit=True)
    try:
        ids = ",".join(str(i) for i in b_jobs)
        for name, setting in [
            ("treadle.steps_written", ids),
            ("treadle.claim_follows", "on"),
            ("treadle.steps_seen", "\ntold b.work\n"),
            ("treadle.claim_turn", "-1; drop table treadle.jobs"),
            ("treadle.distributed", "on"),
            ("treadle.rescue_cursor", "(1,2,3,4,5)"),
            ("treadle.now", "2100-01-01 00:00:00+00"),
        ]:
            a.execute("select set_config(%s, %s, false)", (name, setting))
        row = a.execute(
            "select c.id, c.lease_token, c.lease_until < now() + interval '1 day'"
            " from treadle.claim('w-a', array['a.work']) as c"
        ).fetchone()
        assert row is not None and row[2], "tenant a claims its own job, on the server's clock"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute(
                "select * from treadle.complete_and_claim(array[%s]::bigint[], array[%s]::uuid[], null, 'w-a',"
                " array['a.work', 'b.work'])",
                (row[0], row[1]),
            )
        a.execute("select set_config('treadle.steps_written', %s, false)", (ids,))
        rows = a.execute(
            "select c.finished_state, (c.job).queue from treadle.complete_and_claim("
            "array[%s]::bigint[], array[%s]::uuid[], null, 'w-a', array['a.work']) as c",
            (row[0], row[1]),
        ).fetchall()
        assert rows[0][0] == "completed", "tenant a finishes its own job"
        assert [r[1] for r in rows[1:]] == ["a.work"], "and claims its next one, of its own queue"
        a.execute("select treadle.rescue()")
    finally:
        a.close()
    after = setup.execute(
        "select id, state, run_at, lease_token from treadle.jobs where queue = 'b.work' order by id"
    ).fetchall()
    assert after == before, "tenant b's jobs are as they were"
    assert value(setup, "select state from treadle.jobs where id = %s", (b_claimed,)) == "running"
