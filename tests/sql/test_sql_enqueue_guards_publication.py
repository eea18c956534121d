"""treadle.enqueue_guards under logical replication: a publication FOR ALL TABLES publishes
it with treadle.queues and treadle.tenants, and publishes its deletes, so it needs a replica
identity; without one, every change that removes a guard (a max_depth lifted, a tenant
removed) is refused on the publisher (55000), where 0.3.0 took it. A subscriber, whose
apply fires no trigger, has the guards that were replicated."""

from __future__ import annotations

import time
import uuid
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


def test_a_subscriber_of_all_tables_has_the_publishers_guards(
    conn: psycopg.Connection[Any], dsn: str, new_database: Callable[[], str], make_role: Callable[[str], str]
) -> None:
    """Logical replication applies rows without firing triggers: a subscriber to a
    publication FOR ALL TABLES has the guards because they are replicated, each added and
    each removed (by replica identity FULL), and once it takes enqueues itself (the
    subscription dropped, as on promotion) the rules hold there. Runs where wal_level is
    logical (PGCLUSTER_OPTIONS="-c wal_level=logical")."""
    if conn.execute("show wal_level").fetchone() != ("logical",):
        pytest.skip("wal_level is not logical")
    tenant = make_role("guardsub")
    conn.execute("select treadle.grant_producer(%s)", (tenant,))
    replica_url = new_database()
    slot = f"treadle_guards_{uuid.uuid4().hex[:8]}"
    conn.execute("create publication treadle_guards_all for all tables")
    conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with psycopg.connect(replica_url, autocommit=True) as replica:
        replica.execute(
            f"create subscription {slot} connection '{dsn}' publication treadle_guards_all "
            f"with (create_slot = false, slot_name = '{slot}', copy_data = true)"
        )
        try:

            def synced(expected: int) -> None:
                conn.execute("select treadle.enqueue('sync')")  # a row to wait for
                want = conn.execute("select max(id) from treadle.jobs").fetchone()
                for _ in range(200):
                    got = replica.execute("select max(id) from treadle.jobs").fetchone()
                    if got == want:
                        break
                    time.sleep(0.05)
                else:
                    pytest.fail("the subscriber did not catch up")
                assert len(guards(replica)) == expected

            # each table's initial copy done: a table's changes apply only from then on
            for _ in range(400):
                waiting = replica.execute("select count(*) from pg_subscription_rel where srsubstate <> 'r'").fetchone()
                if waiting == (0,):
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the subscriber did not copy the tables")
            conn.execute(
                "select treadle.set_tenant(%s, 'sub.'), treadle.set_queue('capped', max_depth => 5)", (tenant,)
            )
            synced(2)
            conn.execute("select treadle.set_tenant(%s, null), treadle.set_queue('capped', max_depth => 1)", (tenant,))
            synced(1)
            conn.execute("select treadle.set_tenant(%s, 'sub.')", (tenant,))
            synced(2)
        finally:
            replica.execute(f"alter subscription {slot} disable")
            replica.execute(f"alter subscription {slot} set (slot_name = none)")
            replica.execute(f"drop subscription {slot}")
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))
            conn.execute("drop publication treadle_guards_all")
        # taking enqueues itself: the replicated rules hold
        replica.execute("select treadle.enqueue('n', '{}'::jsonb, queue => 'capped')")
        with pytest.raises(psycopg.Error) as full:
            replica.execute("select treadle.enqueue('n', '{}'::jsonb, queue => 'capped')")
        assert full.value.sqlstate == "TQ001"
        replica.execute(f'set role "{tenant}"')
        with pytest.raises(psycopg.Error) as outside:
            replica.execute("select treadle.enqueue('n', '{}'::jsonb, queue => 'elsewhere')")
        assert outside.value.sqlstate == "42501"
