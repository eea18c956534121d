"""enqueue_many's and enqueue_arrays' rules, read first from treadle.enqueue_guards: a
batch none of whose queues has a guard, with no tenant anywhere, reads neither
treadle.tenants nor treadle.queues; a tenant's prefix and a queue's max_depth still hold,
met through the guard, for a batch of one queue and of several, as each call takes them
(one JSON array, or one array per column); a rule another session commits holds at the
producer's next batch, whose plans are made and kept. A dropped tenant role leaves its
rule (and its guard) until the owner lifts it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.sql.test_sql_enqueue_common import guards

# the two calls that share the rows' checks (treadle._enqueue_rows)
CALLS = ["enqueue_many", "enqueue_arrays"]


def batch(conn: psycopg.Connection[Any], call: str, queues: list[str]) -> str:
    """'ok', or the SQLSTATE of one batch of a job per queue named, in its own transaction."""
    try:
        with conn.transaction():
            if call == "enqueue_many":
                jobs = [{"name": "n", "queue": q} for q in queues]
                conn.execute("select treadle.enqueue_many(%s)", (Jsonb(jobs),)).fetchall()
            else:
                conn.execute(
                    "select treadle.enqueue_arrays(%s::text[], queue => %s::text[])", (["n"] * len(queues), queues)
                ).fetchall()
    except psycopg.Error as error:
        assert error.sqlstate is not None
        return error.sqlstate
    return "ok"


def jobs(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("select count(*) from treadle.jobs").fetchone()
    assert row is not None
    return int(row[0])


READS = (
    "select coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0) from pg_stat_xact_user_tables"
    " where schemaname = 'treadle' and relname in ('tenants', 'queues')"
)


def rule_reads(conn: psycopg.Connection[Any], call: str, queues: list[str]) -> int:
    """How many scans of treadle.tenants and treadle.queues one batch made, the batch rolled
    back: the backend's own counts after it less those before (they hold what the backend
    has not yet reported, earlier transactions' too)."""
    with conn.transaction(force_rollback=True):
        before = conn.execute(READS).fetchone()
        if call == "enqueue_many":
            conn.execute("select treadle.enqueue_many(%s)", (Jsonb([{"name": "n", "queue": q} for q in queues]),))
        else:
            conn.execute(
                "select treadle.enqueue_arrays(%s::text[], queue => %s::text[])", (["n"] * len(queues), queues)
            )
        after = conn.execute(READS).fetchone()
    assert before is not None and after is not None
    return int(after[0]) - int(before[0])


@pytest.mark.parametrize("call", CALLS)
def test_a_batch_without_a_guard_reads_neither_tenants_nor_queues(
    conn: psycopg.Connection[Any], make_role: Callable[[str], str], call: str
) -> None:
    conn.execute("select treadle.pause('stopped'), treadle.set_queue('roomy', concurrency => 5)")
    for queues in (["a"], ["a", "b", "a"], ["stopped"], ["roomy", "a"]):
        assert rule_reads(conn, call, queues) == 0, queues
    # a queue's guard sends a batch that names it to the checks, which read the rules, and
    # a batch of several queues while there is any guard; a tenant's guard, every batch
    conn.execute("select treadle.set_queue('limited', max_depth => 5)")
    assert rule_reads(conn, call, ["a"]) == 0
    assert rule_reads(conn, call, ["a"] * 3) == 0
    assert rule_reads(conn, call, ["limited"]) > 0
    assert rule_reads(conn, call, ["a", "limited"]) > 0
    assert rule_reads(conn, call, ["a", "b"]) > 0
    conn.execute("select treadle.set_queue('limited', concurrency => 5)")
    assert rule_reads(conn, call, ["a", "limited"]) == 0
    conn.execute("select treadle.set_tenant(%s, 't.')", (make_role("manyreads"),))
    assert rule_reads(conn, call, ["a"]) > 0
    assert rule_reads(conn, call, ["a", "b"]) > 0


@pytest.mark.parametrize("call", CALLS)
def test_a_tenant_is_kept_to_its_prefix_through_the_guard(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str], call: str
) -> None:
    tenant, free = make_role("manytenant"), make_role("manyfree")
    conn.execute("select treadle.grant_producer(%s), treadle.grant_producer(%s)", (tenant, free))
    conn.execute("select treadle.set_tenant(%s, 't.')", (tenant,))
    with psycopg.connect(dsn, autocommit=True) as producer:
        producer.execute(f'set role "{tenant}"')
        for queues in (["other"], ["T.x"], ["t.a", "other"], ["other", "t.a"], ["t.a", "t.b", "u.c"]):
            assert batch(producer, call, queues) == "42501", queues
        assert jobs(conn) == 0
        assert batch(producer, call, ["t.a"]) == "ok"
        assert batch(producer, call, ["t.a", "t.b", "t.a"]) == "ok"
        # a role that is no tenant, beside one, enqueues on any queue
        producer.execute("reset role")
        producer.execute(f'set role "{free}"')
        assert batch(producer, call, ["other"]) == "ok"
        assert batch(producer, call, ["other", "t.a"]) == "ok"
    assert jobs(conn) == 7


@pytest.mark.parametrize("call", CALLS)
def test_a_max_depth_is_met_through_the_guard(conn: psycopg.Connection[Any], call: str) -> None:
    conn.execute("select treadle.set_queue('limited', max_depth => 3)")
    assert batch(conn, call, ["limited", "limited"]) == "ok"
    for queues in (["limited", "limited"], ["free", "limited", "limited"], ["limited", "free", "limited"]):
        assert batch(conn, call, queues) == "TQ001", queues
    assert jobs(conn) == 2
    # another queue's max_depth does not hold a batch that does not name it
    assert batch(conn, call, ["free"] * 5) == "ok"
    assert batch(conn, call, ["free", "limited"]) == "ok"
    assert batch(conn, call, ["limited"]) == "TQ001"
    assert jobs(conn) == 9


@pytest.mark.parametrize("call", CALLS)
def test_a_rule_committed_in_another_session_holds_at_the_next_batch(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str], call: str
) -> None:
    """The producer's session has made and kept its plans (more calls than PL/pgSQL makes
    custom plans for) before the owner's session sets a max_depth, makes the producer a
    tenant and lifts both."""
    role = make_role("manylive")
    conn.execute("select treadle.grant_producer(%s)", (role,))
    with psycopg.connect(dsn, autocommit=True) as producer:
        producer.execute(f'set role "{role}"')
        for _ in range(8):
            assert batch(producer, call, ["q"]) == "ok"
            assert batch(producer, call, ["q", "p.q"]) == "ok"
        conn.execute("select treadle.set_queue('q', max_depth => 16)")
        assert batch(producer, call, ["q"]) == "TQ001"
        assert batch(producer, call, ["p.q", "q"]) == "TQ001"
        assert batch(producer, call, ["p.q"]) == "ok"
        conn.execute("select treadle.set_tenant(%s, 'p.')", (role,))
        assert batch(producer, call, ["other"]) == "42501"
        assert batch(producer, call, ["p.q", "other"]) == "42501"
        assert batch(producer, call, ["p.q", "p.r"]) == "ok"
        conn.execute("select treadle.set_tenant(%s, null), treadle.set_queue('q', concurrency => 1)", (role,))
        assert batch(producer, call, ["other", "q"]) == "ok"
        assert batch(producer, call, ["q"]) == "ok"
    assert jobs(conn) == 8 * 3 + 1 + 2 + 2 + 1


def test_a_dropped_tenant_role_leaves_its_rule_until_it_is_lifted(conn: psycopg.Connection[Any]) -> None:
    """DROP ROLE leaves the tenant's row, keyed by the OID no role has now, and its guard,
    which sends every enqueue to the checks; the command of docs/operations.md#tenants
    lifts it (treadle holds no event trigger to do it at the drop)."""
    role = f"treadle_dropped_{uuid.uuid4().hex[:8]}"
    conn.execute(f'create role "{role}"')
    try:
        conn.execute("select treadle.grant_producer(%s), treadle.set_tenant(%s, 'gone.')", (role, role))
        oid = conn.execute("select %s::regrole::oid", (role,)).fetchone()
        conn.execute(f'drop owned by "{role}"')  # treadle's grants: DROP ROLE refuses a role that holds them
        conn.execute(f'drop role "{role}"')
    finally:
        conn.execute(f'drop role if exists "{role}"')
    assert oid is not None
    assert conn.execute("select tenant_role::oid, queue_prefix from treadle.tenants").fetchall() == [(oid[0], "gone.")]
    assert guards(conn) == [f"/{oid[0]}"]
    for call in CALLS:
        assert rule_reads(conn, call, ["a"]) > 0
    lifted = conn.execute(
        "select treadle.set_tenant(t.tenant_role, null) from treadle.tenants as t"
        " where not exists (select 1 from pg_catalog.pg_roles as r where r.oid = t.tenant_role)"
    ).fetchall()
    assert len(lifted) == 1
    assert guards(conn) == []
    for call in CALLS:
        assert rule_reads(conn, call, ["a"]) == 0
