"""treadle._caller_prefix (PL/pgSQL, its plan kept for the session): the prefix of the role
a call is made for, whichever role the session's earlier calls were made for, and the
prefix as it is now when another session changes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect


def prefix(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("select treadle._caller_prefix()").fetchone()
    assert row is not None
    return str(row[0])


def enqueues(conn: psycopg.Connection[Any], queue: str) -> str:
    """'ok', or the SQLSTATE enqueue raised."""
    try:
        conn.execute("select treadle.enqueue('n', queue => %s)", (queue,))
    except psycopg.Error as error:
        return str(error.sqlstate)
    return "ok"


def test_the_prefix_follows_set_role_and_a_change_made_meanwhile(
    connect: Connect, make_role: Callable[[str], str]
) -> None:
    setup, session = connect(), connect()
    a, b = make_role("prefix_a"), make_role("prefix_b")
    for role, given in ((a, "a."), (b, "b.")):
        setup.execute("select treadle.grant_producer(%s), treadle.set_tenant(%s, %s)", (role, role, given))
    for _ in range(8):  # (past the calls after which PL/pgSQL keeps a generic plan)
        assert prefix(session) == ""
    session.execute(f'set role "{a}"')
    assert [prefix(session) for _ in range(8)] == ["a."] * 8
    assert (enqueues(session, "a.q"), enqueues(session, "b.q")) == ("ok", "42501")
    session.execute(f'set role "{b}"')
    assert prefix(session) == "b."
    assert (enqueues(session, "a.q"), enqueues(session, "b.q")) == ("42501", "ok")
    # another session moves b's prefix: the next call here reads it
    setup.execute("select treadle.set_tenant(%s, 'c.')", (b,))
    assert prefix(session) == "c."
    assert (enqueues(session, "b.q"), enqueues(session, "c.q")) == ("42501", "ok")
    session.execute("reset role")
    assert prefix(session) == ""
    # a role set for one transaction only
    with session.transaction():
        session.execute(f'set local role "{a}"')
        assert prefix(session) == "a."
    assert prefix(session) == ""
