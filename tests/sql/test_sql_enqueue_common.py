"""treadle.enqueue's common call (no key, no option but queue, priority, run_at and
max_attempts, small args) against the whole way: the same input gives the same row, or
the same SQLSTATE with nothing written.

The whole way is taken here by passing meta as JSON null, which the common call leaves
to it and which stores what SQL null does (no meta): so each case runs twice, its only
difference the path, and the two outcomes must be equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

# the row as stored, but for what differs between two inserts of the same job
ROW = "select to_jsonb(j) - 'id' - 'created_at' - 'ready_txid' - 'run_at' from treadle.jobs AS j where j.id = %s"


def outcome(
    conn: psycopg.Connection[Any],
    call: str,
    params: dict[str, Any],
    whole_way: bool,
    reader: psycopg.Connection[Any] | None = None,
) -> tuple[Any, ...]:
    """What `select treadle.enqueue(<call>)` did on `conn` (autocommit): ('row', the row, its
    run_at) or ('error', SQLSTATE, whether nothing was written), read on `reader` (or `conn`)."""
    meta = "'null'::jsonb" if whole_way else "NULL"
    read = reader or conn
    before = read.execute("select count(*) from treadle.jobs").fetchone()
    try:
        with conn.transaction():
            row = conn.execute(f"select treadle.enqueue({call}, meta => {meta})", params).fetchone()
    except psycopg.Error as error:
        after = read.execute("select count(*) from treadle.jobs").fetchone()
        return ("error", error.sqlstate, after == before)
    assert row is not None and row[0] is not None
    stored = read.execute(ROW, (row[0],)).fetchone()
    # (run_at: 'now' when it is the call's clock, as created_at is)
    run_at = read.execute(
        "select case when run_at = created_at then 'now' else run_at::text end from treadle.jobs where id = %s",
        (row[0],),
    ).fetchone()
    return ("row", stored, run_at)


def same_both_ways(
    conn: psycopg.Connection[Any], call: str, reader: psycopg.Connection[Any] | None = None, **params: Any
) -> tuple[Any, ...]:
    common = outcome(conn, call, params, whole_way=False, reader=reader)
    whole = outcome(conn, call, params, whole_way=True, reader=reader)
    assert common == whole
    return common


def size_of(conn: psycopg.Connection[Any], text: str) -> int:
    row = conn.execute("select pg_column_size(jsonb_build_object('a', %s::text))", (text,)).fetchone()
    assert row is not None
    return int(row[0])


NAMES = ["x", "", " ", "\t", "a\x01b", "a\nb", "é" * 200, "é" * 201, "x" * 200, "x" * 201, None]


@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_a_name_gives_the_same_both_ways(conn: psycopg.Connection[Any], name: str | None) -> None:
    got = same_both_ways(conn, "%(name)s, '{}'::jsonb", name=name)
    assert got[0] == ("row" if name in ("x", "é" * 200, "x" * 200) else "error")


@pytest.mark.parametrize("queue", NAMES, ids=repr)
def test_a_queue_gives_the_same_both_ways(conn: psycopg.Connection[Any], queue: str | None) -> None:
    got = same_both_ways(conn, "'n', '{}'::jsonb, queue => %(queue)s", queue=queue)
    assert got[0] == ("row" if queue in ("x", "é" * 200, "x" * 200) else "error")


@pytest.mark.parametrize(
    "args",
    [
        None,
        "null",
        "{}",
        "[]",
        '"text"',
        "1",
        "true",
        '{"a": "\\u0001\\n\\t", "b": [1, {"c": null}]}',
        "[" * 100 + "]" * 100,  # 99 levels below the top: within the bound
        "[" * 101 + "]" * 101,  # 100 below: refused
        '{"a": ' * 101 + "1" + "}" * 101,
    ],
    ids=lambda a: repr(a)[:40],
)
def test_args_give_the_same_both_ways(conn: psycopg.Connection[Any], args: str | None) -> None:
    same_both_ways(conn, "'n', %(args)s::jsonb", args=args)


@pytest.mark.parametrize("size", [799, 800, 801, 1024, 1025])
def test_args_at_the_size_bounds_give_the_same_both_ways(conn: psycopg.Connection[Any], size: int) -> None:
    conn.execute("select treadle.configure(max_payload_bytes => 1024)")
    text = "x" * (size - size_of(conn, ""))
    assert size_of(conn, text) == size
    got = same_both_ways(conn, "'n', jsonb_build_object('a', %(text)s::text)", text=text)
    assert got[0] == ("row" if size <= 1024 else "error")


def test_args_nested_too_deep_are_refused_also_when_they_come_compressed(conn: psycopg.Connection[Any]) -> None:
    """Args read from a table may come as they are stored there, compressed: their size is
    then no bound on their depth (each path tested args' depth only from 800 bytes)."""
    conn.execute("create table stored (args jsonb)")
    conn.execute(
        "insert into stored select jsonb_build_array((repeat('[', 110) || repeat(']', 110))::jsonb, repeat('a', 4000))"
    )
    row = conn.execute("select pg_column_size(args), pg_column_compression(args) from stored").fetchone()
    assert row is not None and row[0] < 800 and row[1] is not None, row  # small as stored, but compressed
    got = same_both_ways(conn, "'n', (select s.args from stored as s)")
    assert got[:2] == ("error", "22023")
    # meta the same way
    conn.execute("create table stored_meta (meta jsonb)")
    conn.execute(
        "insert into stored_meta select jsonb_build_object('deep', (repeat('[', 110) || repeat(']', 110))::jsonb,"
        " 'pad', repeat('a', 4000))"
    )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested"):
        conn.execute("select treadle.enqueue('n', meta => (select s.meta from stored_meta as s))")
    assert conn.execute("select count(*) from treadle.jobs").fetchone() == (0,)


@pytest.mark.parametrize("priority", [None, -2147483648, 0, 2147483647])
def test_a_priority_gives_the_same_both_ways(conn: psycopg.Connection[Any], priority: int | None) -> None:
    got = same_both_ways(conn, "'n', '{}'::jsonb, priority => %(priority)s", priority=priority)
    assert got[0] == ("error" if priority is None else "row")


@pytest.mark.parametrize("max_attempts", [None, -1, 0, 1, 2147483647])
def test_max_attempts_give_the_same_both_ways(conn: psycopg.Connection[Any], max_attempts: int | None) -> None:
    got = same_both_ways(conn, "'n', '{}'::jsonb, max_attempts => %(m)s", m=max_attempts)
    assert got[0] == ("row" if max_attempts and max_attempts >= 1 else "error")


@pytest.mark.parametrize(
    "run_at", [None, "infinity", "-infinity", "4713-01-01 00:00:00+00 BC", "294276-12-31 00:00:00+00", "2000-01-01"]
)
def test_a_run_at_gives_the_same_both_ways(conn: psycopg.Connection[Any], run_at: str | None) -> None:
    got = same_both_ways(conn, "'n', '{}'::jsonb, run_at => %(run_at)s::timestamptz", run_at=run_at)
    if run_at is None:
        # the whole way reads null as now; each call its own now
        assert got[0] == "row"
    else:
        assert got[0] == ("error" if "infinity" in run_at else "row")


@pytest.mark.parametrize("option", ["on_conflict => NULL", "unique_while => NULL", "on_conflict => 'replace'"])
def test_a_key_option_without_a_key_gives_the_same_both_ways(conn: psycopg.Connection[Any], option: str) -> None:
    same_both_ways(conn, f"'n', '{{}}'::jsonb, {option}")


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_queue_with_a_max_depth_gives_the_same_both_ways(conn: psycopg.Connection[Any], depth: int) -> None:
    """A queue that holds its max_depth of jobs exactly, or one or two below it."""
    conn.execute("select treadle.set_queue('limited', max_depth => 3)")
    for _ in range(3 - depth):
        conn.execute("select treadle.enqueue('held', queue => 'limited')")
    common = outcome(conn, "'n', '{}'::jsonb, queue => 'limited'", {}, whole_way=False)
    conn.execute("delete from treadle.jobs where name = 'n'")
    whole = outcome(conn, "'n', '{}'::jsonb, queue => 'limited'", {}, whole_way=True)
    assert common[:2] == whole[:2]
    assert common[0] == ("error" if depth == 0 else "row")
    if depth == 0:
        assert common[1] == "TQ001" and common[2] is True


def test_a_paused_queue_gives_the_same_both_ways(conn: psycopg.Connection[Any]) -> None:
    conn.execute("select treadle.pause('stopped')")
    assert same_both_ways(conn, "'n', Jsonb_build_array(1), queue => 'stopped'")[0] == "row"


@pytest.mark.parametrize("queue", ["t.work", "t", "other", "T.work"])
def test_a_tenant_gives_the_same_both_ways(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str], queue: str
) -> None:
    """A tenant's session (SET ROLE), its queue inside and outside its prefix."""
    role = make_role("enqcommon")
    conn.execute("select treadle.grant_producer(%s), treadle.set_tenant(%s, 't.')", (role, role))
    with psycopg.connect(dsn, autocommit=True) as tenant:
        tenant.execute(f'set role "{role}"')
        got = same_both_ways(
            tenant, "'n', %(args)s, queue => %(queue)s", reader=conn, args=Jsonb({"k": 1}), queue=queue
        )
    assert got[0] == ("row" if queue == "t.work" else "error")
    if got[0] == "error":
        assert got[1:] == ("42501", True)


# treadle.enqueue_guards as it is, and as treadle.queues and treadle.tenants say it must be
GUARDS = """
select (select coalesce(array_agg(g.queue || '/' || coalesce(g.tenant_role::oid::text, '-')
                                  order by g.queue, g.tenant_role), '{}')
          from treadle.enqueue_guards as g),
       (select coalesce(array_agg(d.k order by d.q, d.r), '{}')
          from (select s.queue as q, null::oid as r, s.queue || '/-' as k
                  from treadle.queues as s where s.max_depth is not null
                union all
                select '', t.tenant_role::oid, '/' || t.tenant_role::oid::text from treadle.tenants as t) as d)
"""


def guards(conn: psycopg.Connection[Any]) -> list[str]:
    """The guard rows, after checking that they are the ones the queues and the tenants make."""
    row = conn.execute(GUARDS).fetchone()
    assert row is not None
    assert row[0] == row[1]
    return list(row[0])


def test_the_guards_follow_every_write_to_queues_and_tenants(
    conn: psycopg.Connection[Any], make_role: Callable[[str], str]
) -> None:
    """set_queue, set_tenant and the owner's own writes to the two tables (each kind of
    statement, TRUNCATE too) leave the guards that the tables make, and nothing else."""
    one, two = make_role("guard1"), make_role("guard2")
    steps = [
        "select treadle.set_queue('a', max_depth => 5)",
        "select treadle.set_queue('b', concurrency => 2)",
        "select treadle.set_queue('b', concurrency => 2, max_depth => 1)",
        "select treadle.set_queue('a', max_depth => 7)",
        "select treadle.set_queue('a', concurrency => 3)",  # max_depth lifted, the row stays
        "select treadle.set_queue('b')",  # no setting left: the row goes
        "select treadle.pause('c')",
        "update treadle.queues set max_depth = 9 where queue = 'c'",
        "update treadle.queues set queue = 'c2' where queue = 'c'",
        "insert into treadle.queues (queue, max_depth, updated_at) values ('d', 4, now()), ('e', null, now())",
        "update treadle.queues set max_depth = null",
        "update treadle.queues set max_depth = 3",
        "delete from treadle.queues where queue = 'd'",
        f"select treadle.set_tenant('{one}', 'one.')",
        f"select treadle.set_tenant('{one}', 'uno.')",
        f"update treadle.tenants set tenant_role = '{two}' where tenant_role = '{one}'::regrole",
        f"select treadle.set_tenant('{one}', 'one.')",
        f"select treadle.set_tenant('{one}', null)",
        f"insert into treadle.tenants values ('{one}', 'one.')",
        "truncate treadle.queues",
        f"delete from treadle.tenants where tenant_role = '{two}'::regrole",
        f"select treadle.set_tenant('{two}', 'two.')",
        "truncate treadle.tenants",
    ]
    seen = set()
    for step in steps:
        conn.execute(step)
        seen.add(len(guards(conn)))
    assert guards(conn) == []
    assert seen >= {0, 1, 2, 3}


def test_a_change_committed_in_another_session_holds_at_the_next_enqueue(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str]
) -> None:
    """A producer's session enqueues on the common call (its plans made and kept), while the
    owner's session sets a max_depth, makes the producer a tenant and lifts both: each
    committed change holds at the producer's next enqueue, in its open transaction too."""
    role = make_role("guardlive")
    conn.execute("select treadle.grant_producer(%s)", (role,))
    with psycopg.connect(dsn, autocommit=True) as producer:
        producer.execute(f'set role "{role}"')

        def enqueue(queue: str) -> str:
            try:
                producer.execute("select treadle.enqueue('n', '{}'::jsonb, queue => %s)", (queue,))
            except psycopg.Error as error:
                assert error.sqlstate is not None
                return error.sqlstate
            return "ok"

        for _ in range(8):
            assert enqueue("q") == "ok"
        conn.execute("select treadle.set_queue('q', max_depth => 8)")
        assert enqueue("q") == "TQ001"
        assert enqueue("p.q") == "ok"
        conn.execute("select treadle.set_tenant(%s, 'p.')", (role,))
        assert enqueue("other") == "42501"
        assert enqueue("p.q") == "ok"
        conn.execute("select treadle.set_tenant(%s, null)", (role,))
        assert enqueue("other") == "ok"
        conn.execute("select treadle.set_queue('q', concurrency => 1)")
        assert enqueue("q") == "ok"
        # in the producer's own transaction (read committed): the next statement sees the change
        with producer.transaction():
            assert enqueue("other") == "ok"
            conn.execute("select treadle.set_tenant(%s, 'p.')", (role,))
            assert enqueue("other") == "42501"
    # the one enqueued while the rule was lifted (the refusal took the transaction's with it)
    assert conn.execute("select count(*) from treadle.jobs where queue = 'other'").fetchone() == (1,)


def test_a_role_that_is_no_tenant_enqueues_beside_tenants_and_depths(
    conn: psycopg.Connection[Any], dsn: str, make_role: Callable[[str], str]
) -> None:
    """With tenants and a max_depth about, a producer that is no tenant enqueues on any
    queue, and the queue with a max_depth still counts."""
    tenant, producer_role = make_role("guardtenant"), make_role("guardfree")
    conn.execute("select treadle.set_tenant(%s, 't.'), treadle.grant_producer(%s)", (tenant, producer_role))
    conn.execute("select treadle.set_queue('full', max_depth => 1)")
    with psycopg.connect(dsn, autocommit=True) as producer:
        producer.execute(f'set role "{producer_role}"')
        for queue in ("default", "t.x", "full"):
            producer.execute("select treadle.enqueue('n', '{}'::jsonb, queue => %s)", (queue,))
        with pytest.raises(psycopg.Error) as refused:
            producer.execute("select treadle.enqueue('n', '{}'::jsonb, queue => 'full')")
        assert refused.value.sqlstate == "TQ001"
    assert conn.execute("select count(*) from treadle.jobs").fetchone() == (3,)
