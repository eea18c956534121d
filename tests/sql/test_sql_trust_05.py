"""The trust boundary, second round, across real sessions: a lease token leaked to another
tenant's session holds nothing there, whatever that session set by hand (treadle.* settings,
its search_path, temporary tables named as treadle's); and the plain install into a database
where another role made schema treadle first (with a `treadle.now` or a `treadle.version` of
its own) refuses, names what it found, and leaves that role's objects as they were."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import NewDatabase, as_role
from tests.plain_install import PLAIN_OWNER, grant_plain_owner
from tests.sql.sqlcalls import Connect, value
from treadle import install


def tenant(setup: psycopg.Connection, make_role: Callable[[str], str], purpose: str, prefix: str) -> str:
    """A new login role with the worker part, kept to the queues under prefix."""
    role = make_role(purpose)
    setup.execute("select treadle.grant_worker(%s), treadle.set_tenant(%s, %s)", (role, role, prefix))
    return role


def test_a_leaked_token_holds_nothing_in_another_tenants_session(
    connect: Connect, dsn: str, make_role: Callable[[str], str]
) -> None:
    """Tenant b's worker claims; its token reaches tenant a's session, which first sets what a
    session may set by hand: the treadle.* settings, a search_path with pg_temp and public
    first, and temporary tables named tenants and jobs (its own, empty: no rule, a running
    job). Every call that takes a token answers a as for a stale one; b's token still holds."""
    setup = connect()
    role_a = tenant(setup, make_role, "t5_leak_a", "a.")
    role_b = tenant(setup, make_role, "t5_leak_b", "b.")
    setup.execute("select treadle.enqueue('b', queue => 'b.work')")
    setup.execute("select treadle.enqueue('a', queue => 'a.work')")
    b = psycopg.connect(as_role(dsn, role_b), autocommit=True)
    a = psycopg.connect(as_role(dsn, role_a), autocommit=True)
    try:
        claimed = b.execute("select id, lease_token from treadle.claim('w-b', array['b.work'])").fetchone()
        assert claimed is not None
        job, token = claimed
        before = setup.execute(
            "select id, state, lease_until, lease_token, result, progress from treadle.jobs"
        ).fetchall()

        a.execute("create temp table tenants (tenant_role regrole, queue_prefix text)")
        a.execute("create temp table jobs (id bigint, queue text, state text, lease_token uuid)")
        a.execute("insert into pg_temp.jobs values (%s, 'a.work', 'running', %s)", (job, token))
        a.execute("set search_path = pg_temp, public, treadle")
        for name, setting in [
            ("treadle.now", "2100-01-01 00:00:00+00"),
            ("treadle.distributed", "on"),
            ("treadle.claim_follows", "on"),
            ("treadle.steps_written", str(job)),
            ("treadle.claim_checked", "0"),
        ]:
            a.execute("select set_config(%s, %s, false)", (name, setting))

        assert value(a, "select treadle.complete(%s, %s, '{\"forged\": 1}')", (job, token)) is None
        assert value(a, "select treadle.complete(%s, %s, null, 'b.work')", (job, token)) is None
        assert value(a, "select treadle.complete(%s, %s, null, 'a.work')", (job, token)) is None
        assert value(a, "select treadle.fail(%s, %s, 'forged', retryable => false)", (job, token)) is None
        assert value(a, "select treadle.release(%s, %s)", (job, token)) is None
        assert value(a, "select treadle.snooze(%s, %s, '1 day')", (job, token)) is None
        assert value(a, "select treadle.heartbeat(%s, %s, '1 day')", (job, token)) == "lost"
        assert value(a, "select treadle.progress(%s, %s, 1, 'forged')", (job, token)) is False
        assert value(a, "select count(*) from treadle.claimed(%s)", (token,)) == 0
        assert a.execute(
            "select state from treadle.complete_many(array[%s]::bigint[], array[%s]::uuid[])", (job, token)
        ).fetchall() == [(None,)]
        assert a.execute(
            "select answer from treadle.heartbeat_many(array[%s]::bigint[], array[%s]::uuid[])", (job, token)
        ).fetchall() == [("lost",)]
        finished = a.execute(
            "select c.finished_state, (c.job).queue from treadle.complete_and_claim("
            "array[%s]::bigint[], array[%s]::uuid[], null, 'w-a', array['a.work']) as c",
            (job, token),
        ).fetchall()
        assert finished[0] == (None, None), "tenant b's job is not finished"
        assert [r[1] for r in finished[1:]] == ["a.work"], "tenant a claims its own job as usual"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute("select treadle.claim('w-a', array['b.work'])")
        # nor may it act as another role: it is a member of none
        for become in (
            f'set role "{role_b}"',
            f"select set_config('role', '{role_b}', false)",
            "set role postgres",
            f'set session authorization "{role_b}"',
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute(become)
        assert value(a, "select current_user") == role_a

        after = setup.execute(
            "select id, state, lease_until, lease_token, result, progress from treadle.jobs"
        ).fetchall()
        assert [r for r in after if r[0] == job] == [r for r in before if r[0] == job], "tenant b's job is as it was"
        assert value(b, "select treadle.heartbeat(%s, %s)", (job, token)) == "held"
        assert value(b, "select treadle.complete(%s, %s, '{\"ok\": 1}')", (job, token)) == "completed"
        # a's repeat of that finish is not told that it completed
        assert value(a, "select treadle.complete(%s, %s)", (job, token)) is None
        assert value(setup, "select result from treadle.jobs where id = %s", (job,)) == {"ok": 1}
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("planted", ["now", "version"])
def test_the_plain_install_refuses_a_schema_another_role_made_first(
    new_database: NewDatabase, make_role: Callable[[str], str], planted: str
) -> None:
    """Another role with CREATE on the database makes schema treadle first, with a
    `treadle.now` (or a `treadle.version` that claims this version) and a type of its own.
    The plain install, run by the intended owner, refuses; what was planted is unchanged,
    and nothing of treadle's is made beside it."""
    url = new_database(None)
    dbname = url.rsplit("/", 1)[1]
    squatter = make_role("t5_squatter")
    grant_plain_owner(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO "{squatter}"')
    with psycopg.connect(as_role(url, squatter), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA treadle")
        conn.execute("CREATE TYPE treadle.jobs AS (id bigint)")
        if planted == "now":
            conn.execute(
                "CREATE FUNCTION treadle.now() RETURNS timestamptz LANGUAGE sql"
                " AS $$ SELECT '2000-01-01'::timestamptz $$"
            )
        else:
            conn.execute(
                f"CREATE FUNCTION treadle.version() RETURNS text LANGUAGE sql AS $$ SELECT '{install.VERSION}' $$"
            )
        conn.execute("GRANT USAGE ON SCHEMA treadle TO PUBLIC")
        conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA treadle TO PUBLIC")
    with psycopg.connect(url) as conn:
        before = conn.execute(
            "select p.oid, p.proname, p.prosrc, pg_get_userbyid(p.proowner) from pg_proc as p"
            " where p.pronamespace = 'treadle'::regnamespace"
        ).fetchall()
    with psycopg.connect(as_role(url, PLAIN_OWNER), autocommit=True) as conn:
        with pytest.raises((psycopg.Error, install.InstallError)) as refused:
            install.apply(conn, install.plan_install(conn, mode="plain"))
    message = str(refused.value)
    if planted == "version":
        assert f"owned by role {squatter}, not by {PLAIN_OWNER}" in message, message
    else:
        assert "treadle" in message and "exists" in message, message
    with psycopg.connect(url) as conn:
        after = conn.execute(
            "select p.oid, p.proname, p.prosrc, pg_get_userbyid(p.proowner) from pg_proc as p"
            " where p.pronamespace = 'treadle'::regnamespace"
        ).fetchall()
        assert after == before and {r[3] for r in after} == {squatter}
        # the planted type's relation alone
        assert value(conn, "select count(*) from pg_class where relnamespace = 'treadle'::regnamespace") == 1
        assert value(conn, "select pg_get_userbyid(nspowner) from pg_namespace where nspname = 'treadle'") == squatter
