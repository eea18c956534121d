"""treadle.now() moves with the setting treadle.now only for a role that may create in
schema treadle, whichever function reads it: treadle._moved_clock (which anyone may
execute) inside enqueue and claim (SECURITY DEFINER, run as the owner) tests the
caller's role, in a session of its own (session_user) and after SET ROLE."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.conftest import as_role

PAST = "2000-01-01 00:00:00+00"


@pytest.mark.parametrize("how", ["login", "set role"])
@pytest.mark.parametrize("part", ["producer", "worker", "none"])
def test_a_role_without_create_does_not_move_the_clock(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str], how: str, part: str
) -> None:
    role = make_role("clock")
    if part != "none":
        conn.execute(f"select treadle.grant_{part}(%s)", (role,))
    url = as_role(dsn, role) if how == "login" else dsn
    with psycopg.connect(url, autocommit=True) as session:
        if how == "set role":
            session.execute(f'set role "{role}"')
        session.execute("select set_config('treadle.now', %s, false)", (PAST,))
        if part == "none":
            # no USAGE on schema treadle: neither the clock nor its helper is within reach
            for call in ("select treadle._moved_clock(%s)", "select treadle.now() > %s::timestamptz"):
                with pytest.raises(psycopg.Error) as refused:
                    session.execute(call, (PAST,))
                assert refused.value.sqlstate == "42501"
            return
        # the helper, called by hand, gives its caller nothing
        assert session.execute("select treadle._moved_clock(%s)", (PAST,)).fetchone() == (None,)
        assert session.execute("select treadle.now() > %s::timestamptz", (PAST,)).fetchone() == (True,)
        job = session.execute("select treadle.enqueue('n', run_at => '2001-01-01 00:00:00+00')").fetchone()
        assert job is not None
        if part == "worker":
            # the job is due only at 2001, the real clock's past: a moved clock (2000) would hold it
            assert session.execute("select count(*) from treadle.claim('w')").fetchone() == (1,)
    row = conn.execute("select created_at > %s::timestamptz from treadle.jobs where id = %s", (PAST, job[0]))
    assert row.fetchone() == (True,)


def test_the_owner_moves_the_clock_through_enqueue(conn: psycopg.Connection[Any]) -> None:
    conn.execute("select set_config('treadle.now', %s, false)", (PAST,))
    job = conn.execute("select treadle.enqueue('n')").fetchone()
    assert job is not None
    assert conn.execute(
        "select created_at = %s::timestamptz from treadle.jobs where id = %s", (PAST, job[0])
    ).fetchone() == (True,)
