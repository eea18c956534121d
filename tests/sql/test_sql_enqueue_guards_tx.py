"""treadle.enqueue_guards in the transaction that changes a rule: an enqueue after the
change in the same transaction obeys it, a rolled-back change (or savepoint) takes its
guard with it, a renamed tenant role keeps its rule, and a REPEATABLE READ producer obeys
what its snapshot holds of the rule and the guard alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.sql.test_sql_enqueue_common import guards


def sqlstate(conn: psycopg.Connection[Any], queue: str) -> str:
    try:
        with conn.transaction():
            conn.execute("select treadle.enqueue('n', '{}'::jsonb, queue => %s)", (queue,))
    except psycopg.Error as error:
        assert error.sqlstate is not None
        return error.sqlstate
    return "ok"


def test_a_rule_changed_in_the_enqueuing_transaction_and_rolled_back(
    conn: psycopg.Connection[Any], make_role: Callable[[str], str]
) -> None:
    role = make_role("guardtx")
    conn.execute("select treadle.grant_producer(%s)", (role,))
    with conn.transaction(force_rollback=True):
        conn.execute("select treadle.set_queue('q', max_depth => 1)")
        assert sqlstate(conn, "q") == "ok"
        assert sqlstate(conn, "q") == "TQ001"
        conn.execute("select treadle.set_tenant(%s, 'p.')", (role,))
        conn.execute(f'set local role "{role}"')
        assert sqlstate(conn, "other") == "42501"
        assert sqlstate(conn, "p.x") == "ok"
        conn.execute("reset role")
        assert len(guards(conn)) == 2
    assert guards(conn) == []
    # a savepoint rolled back takes its guard, and only its own
    with conn.transaction():
        conn.execute("select treadle.set_queue('q', max_depth => 5)")
        with pytest.raises(psycopg.errors.RaiseException), conn.transaction():
            conn.execute("select treadle.set_tenant(%s, 'p.')", (role,))
            conn.execute("do $$ begin raise exception 'undo'; end $$")
        assert len(guards(conn)) == 1
    assert len(guards(conn)) == 1
    assert conn.execute("select count(*) from treadle.jobs").fetchone() == (0,)


def test_a_renamed_tenant_role_keeps_its_rule(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str]
) -> None:
    role = make_role("guardname")
    conn.execute("select treadle.grant_producer(%s), treadle.set_tenant(%s, 'p.')", (role, role))
    conn.execute(f'alter role "{role}" rename to "{role}_r"')
    try:
        with psycopg.connect(dsn, autocommit=True) as tenant:
            tenant.execute(f'set role "{role}_r"')
            assert sqlstate(tenant, "other") == "42501"
            assert sqlstate(tenant, "p.x") == "ok"
        assert len(guards(conn)) == 1
    finally:
        conn.execute(f'alter role "{role}_r" rename to "{role}"')


def test_a_repeatable_read_producer_obeys_its_snapshot_of_the_rule(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str]
) -> None:
    """The rule and its guard are committed together: a snapshot has both or neither, so
    the common call and the whole way agree (meta JSON null takes the whole way)."""
    role = make_role("guardrr")
    conn.execute("select treadle.grant_producer(%s)", (role,))
    with psycopg.connect(dsn) as producer:
        producer.execute(f'set role "{role}"')
        producer.commit()
        producer.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        producer.execute("select 1")  # the snapshot: no rule
        conn.execute("select treadle.set_tenant(%s, 'p.')", (role,))
        for meta in ("NULL", "'null'::jsonb"):
            producer.execute(f"select treadle.enqueue('n', '{{}}'::jsonb, queue => 'other', meta => {meta})")
        producer.commit()
        for meta in ("NULL", "'null'::jsonb"):
            with pytest.raises(psycopg.Error) as refused:
                producer.execute(f"select treadle.enqueue('n', '{{}}'::jsonb, queue => 'other', meta => {meta})")
            assert refused.value.sqlstate == "42501"
            producer.rollback()
    assert conn.execute("select count(*) from treadle.jobs").fetchone() == (2,)
