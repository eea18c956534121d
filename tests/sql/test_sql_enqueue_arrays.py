"""treadle.enqueue_arrays: enqueue_many's jobs as one array per column.

The same rows as enqueue_many for the same jobs; every bad array or element refused
with enqueue_many's SQLSTATE and words, and nothing written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

COLUMNS = "name, args, queue, priority, max_attempts, idempotency_key, every, timeout, meta, concurrency_key"


def arrays(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None = None) -> list[int]:
    return [r[0] for r in conn.execute(f"SELECT * FROM treadle.enqueue_arrays({sql})", params or {}).fetchall()]


def test_ids_in_input_order_and_the_same_rows_as_enqueue_many(conn: psycopg.Connection[Any]) -> None:
    ids = arrays(
        conn,
        """ARRAY['a', 'b', 'c'], args => ARRAY['{"x": 1}', '[1]', NULL]::jsonb[],
                          queue => ARRAY['q1', NULL, 'q2'], priority => ARRAY[3, NULL, -1],
                          max_attempts => ARRAY[NULL, 2, NULL]::integer[],
                          every => ARRAY['1 hour', NULL, NULL]::interval[],
                          timeout => ARRAY[NULL, '5 minutes', NULL]::interval[],
                          meta => ARRAY[NULL, '{"m": 1}', 'null']::jsonb[],
                          concurrency_key => ARRAY[NULL, NULL, 'k']""",
    )
    many = [
        r[0]
        for r in conn.execute("""SELECT * FROM treadle.enqueue_many('[
        {"name": "a", "args": {"x": 1}, "queue": "q1", "priority": 3, "every": "1 hour"},
        {"name": "b", "args": [1], "max_attempts": 2, "timeout": "5 minutes", "meta": {"m": 1}},
        {"name": "c", "queue": "q2", "priority": -1, "meta": null, "concurrency_key": "k"}]')""").fetchall()
    ]
    assert ids == sorted(ids) and len(ids) == 3
    rows = {r[0]: r[1:] for r in conn.execute(f"SELECT id, {COLUMNS} FROM treadle.jobs").fetchall()}
    assert [rows[i] for i in ids] == [rows[i] for i in many]
    assert rows[ids[1]][1:3] == ([1], "default")
    # the two jobs of concurrency key k: the first takes its one slot, the second waits
    states = dict(conn.execute("SELECT id, state FROM treadle.jobs WHERE concurrency_key = 'k'").fetchall())
    assert (states[ids[2]], states[many[2]]) == ("available", "blocked")


def test_keys_repeated_or_held_answer_the_holder(conn: psycopg.Connection[Any]) -> None:
    (held,) = arrays(conn, "ARRAY['h'], idempotency_key => ARRAY['k1']")
    ids = arrays(conn, "ARRAY['a', 'b', 'c', 'd'], idempotency_key => ARRAY['k1', 'k2', 'k2', NULL]")
    assert ids[0] == held and ids[1] == ids[2] and len(set(ids)) == 3
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (3,)


def test_an_empty_batch_is_nothing(conn: psycopg.Connection[Any]) -> None:
    assert arrays(conn, "ARRAY[]::text[]") == []


BAD = [
    ("NULL::text[]", "22004", "name must not be null"),
    (
        "ARRAY['a'], queue => ARRAY['q', 'r']",
        "22023",
        "queue must be a one-dimensional array, counted from 1, of as many elements as name",
    ),
    ("ARRAY['a', 'b'], args => ARRAY['{}']::jsonb[]", "22023", "args must be a one-dimensional array"),
    ("ARRAY[['a'], ['b']]", "22023", "name must be a one-dimensional array"),
    ("ARRAY['a'], priority => ARRAY[[1]]", "22023", "priority must be a one-dimensional array"),
    ("'[0:1]={a,b}'::text[]", "22023", "name must be a one-dimensional array, counted from 1"),
    ("ARRAY['a'], meta => '[2:2]={null}'::jsonb[]", "22023", "meta must be a one-dimensional array, counted from 1"),
    ("ARRAY['a', NULL]", "22023", 'jobs element 1 needs a "name" of 1 to 200 characters'),
    ("ARRAY['a', ' ']", "22023", 'jobs element 1 needs a "name"'),
    ("ARRAY[repeat('n', 201)]", "22023", 'jobs element 0 needs a "name"'),
    ("ARRAY[E'a\\nb']", "22023", 'jobs element 0 needs a "name"'),
    ("ARRAY['a'], queue => ARRAY['']", "22023", 'jobs element 0 has a "queue" that is not 1 to 200'),
    ("ARRAY['a'], args => ARRAY['1']::jsonb[]", "22023", 'jobs element 0 has "args" that are neither an object'),
    ("ARRAY['a'], args => ARRAY['\"s\"']::jsonb[]", "22023", 'has "args" that are neither'),
    (
        "ARRAY['a'], args => ARRAY[(repeat('[', 101) || repeat(']', 101))::jsonb]",
        "22023",
        'jobs element 0 has "args" nested more than 100 levels deep',
    ),
    (
        "ARRAY['a'], args => ARRAY[jsonb_build_object('x', repeat('y', 1100000))]",
        "22023",
        'jobs element 0 has "args" larger than the limit of 1048576 bytes',
    ),
    (
        "ARRAY['a'], max_attempts => ARRAY[0]",
        "22023",
        'jobs element 0 has a "max_attempts" that is not an integer of at least 1',
    ),
    (
        "ARRAY['a'], run_at => ARRAY['infinity']::timestamptz[]",
        "22023",
        'jobs element 0 has a "run_at" that is not a finite time',
    ),
    ("ARRAY['a'], idempotency_key => ARRAY['  ']", "22023", 'jobs element 0 has an "idempotency_key" that is not'),
    ("ARRAY['a'], every => ARRAY['0 s']::interval[]", "22023", 'jobs element 0 has an "every" that is not positive'),
    ("ARRAY['a'], every => ARRAY['11 years']::interval[]", "22023", 'has an "every" that is not positive or is longer'),
    (
        "ARRAY['a'], timeout => ARRAY['-1 s']::interval[]",
        "22023",
        'jobs element 0 has a "timeout" that is not positive',
    ),
    (
        "ARRAY['a'], timeout => ARRAY['8 days']::interval[]",
        "22023",
        'has a "timeout" that is not positive or is longer',
    ),
    ("ARRAY['a'], meta => ARRAY['[1]']::jsonb[]", "22023", 'jobs element 0 has a "meta" that is not an object'),
    (
        "ARRAY['a'], meta => ARRAY[(repeat('{\"a\":', 101) || '1' || repeat('}', 101))::jsonb]",
        "22023",
        'jobs element 0 has a "meta" nested more than 100 levels deep',
    ),
    ("ARRAY['a'], concurrency_key => ARRAY['']", "22023", 'jobs element 0 has a "concurrency_key" that is not'),
    (
        "ARRAY['a'], run_at => ARRAY['294276-12-30']::timestamptz[], every => ARRAY['10 years']::interval[]",
        "22023",
        "next occurrence cannot be stored",
    ),
]


@pytest.mark.parametrize(("sql", "sqlstate", "message"), BAD, ids=[b[2][:40] + f" {i}" for i, b in enumerate(BAD)])
def test_a_bad_array_or_element_is_refused_and_writes_nothing(
    conn: psycopg.Connection[Any], sql: str, sqlstate: str, message: str
) -> None:
    # a good job first: the whole call is refused, the good one with it
    good = "ARRAY['good'] || " if sql.startswith("ARRAY['a']") and "=>" not in sql else ""
    with pytest.raises(psycopg.Error) as refused:
        arrays(conn, good + sql)
    assert refused.value.sqlstate == sqlstate
    assert message in str(refused.value)
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


def test_the_first_bad_element_is_named(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.Error, match='jobs element 2 has a "max_attempts"'):
        arrays(conn, "ARRAY['a', 'b', 'c', ''], max_attempts => ARRAY[1, 2, 0, 1]")


def test_max_depth_counts_every_job(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT treadle.set_queue('q', max_depth => 2)")
    with pytest.raises(psycopg.Error) as refused:
        arrays(conn, "ARRAY['a', 'b', 'c'], queue => ARRAY['q', 'q', 'q']")
    assert refused.value.sqlstate == "TQ001"
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


def test_jsonb_elements_sent_by_a_client(conn: psycopg.Connection[Any]) -> None:
    ids = arrays(
        conn, "%(name)s::text[], args => %(args)s::jsonb[]", {"name": ["a", "b"], "args": [Jsonb({"i": 1}), Jsonb([2])]}
    )
    assert conn.execute("SELECT args FROM treadle.jobs WHERE id = ANY(%s) ORDER BY id", [ids]).fetchall() == [
        ({"i": 1},),
        ([2],),
    ]
