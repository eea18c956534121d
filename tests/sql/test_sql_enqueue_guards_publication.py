"""treadle.enqueue_guards under logical replication: a publication FOR ALL TABLES publishes
it with treadle.queues and treadle.tenants, and publishes its deletes, so it needs a replica
identity; without one, every change that removes a guard (a max_depth lifted, a tenant
removed) is refused on the publisher (55000), where 0.3.0 took it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.sql.test_sql_enqueue_common import guards


@pytest.fixture
def all_tables(conn: psycopg.Connection[Any]) -> Iterator[None]:
    conn.execute("create publication treadle_guards_all for all tables")
    try:
        yield
    finally:
        conn.execute("drop publication treadle_guards_all")


@pytest.mark.usefixtures("all_tables")
def test_guards_removed_under_a_publication_for_all_tables(
    conn: psycopg.Connection[Any], make_role: Callable[[str], str]
) -> None:
    """Each write that removes a guard row goes through, and the guards stay the tables'."""
    role = make_role("guardpub")
    steps = [
        "select treadle.set_queue('q', max_depth => 5)",
        "select treadle.set_queue('q', max_depth => 6)",
        "select treadle.set_queue('q', concurrency => 1)",
        f"select treadle.set_tenant('{role}', 'pub.')",
        f"select treadle.set_tenant('{role}', null)",
        "update treadle.queues set max_depth = 2",
        "delete from treadle.queues",
        f"select treadle.set_tenant('{role}', 'pub.')",
        "truncate treadle.tenants",
    ]
    for step in steps:
        conn.execute(step)
        guards(conn)
    assert guards(conn) == []
    identity = conn.execute("select relreplident from pg_class where oid = 'treadle.enqueue_guards'::regclass")
    assert identity.fetchone() == ("f",)
