"""treadle.enqueue_many on a Citus cluster (make test-citus): several queues, idempotency
keys, concurrency keys, and two concurrent calls whose keys come in opposite orders."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import treadle
from tests.citus.conftest import CITUS_URL

Conn = psycopg.Connection[dict[str, Any]]


def enqueue_many(conn: Conn, jobs: list[dict[str, Any]]) -> list[int]:
    rows = conn.execute("SELECT id FROM treadle.enqueue_many(%s) AS id", [Jsonb(jobs)]).fetchall()
    return [int(r["id"]) for r in rows]


def other_queue() -> str:
    return f"q{uuid.uuid4().hex[:10]}"


def test_jobs_of_several_queues_land_each_in_its_queue_in_input_order(conn: Conn, queue: str) -> None:
    second = other_queue()
    jobs = [{"name": f"j{i}", "queue": (queue, second)[i % 2], "args": {"i": i}} for i in range(20)]
    ids = enqueue_many(conn, jobs)
    assert len(ids) == len(set(ids)) == 20
    for job_id, spec in zip(ids, jobs, strict=True):
        row = conn.execute(
            "SELECT name, args, state FROM treadle.jobs WHERE queue = %s AND id = %s", [spec["queue"], job_id]
        ).fetchone()
        assert row == {"name": spec["name"], "args": spec["args"], "state": "available"}


def test_keys_held_before_and_repeated_in_the_call_answer_the_holder(conn: Conn, queue: str) -> None:
    second = other_queue()
    held = enqueue_many(conn, [{"name": "held", "queue": queue, "idempotency_key": "a"}])[0]
    ids = enqueue_many(
        conn,
        [
            {"name": "x", "queue": queue, "idempotency_key": "a"},
            {"name": "y", "queue": second, "idempotency_key": "a"},
            {"name": "z", "queue": second, "idempotency_key": "a"},
            {"name": "w", "queue": queue},
        ],
    )
    assert ids[0] == held
    assert ids[1] == ids[2] != held
    assert len({ids[1], ids[3], held}) == 3
    counts = conn.execute(
        "SELECT queue, count(*)::int AS n FROM treadle.jobs WHERE queue = ANY(%s) GROUP BY queue", [[queue, second]]
    ).fetchall()
    assert {r["queue"]: r["n"] for r in counts} == {queue: 2, second: 1}


def test_concurrency_keys_release_what_the_key_limit_allows(conn: Conn, queue: str) -> None:
    conn.execute("SELECT treadle.set_queue(%s, key_limit => 1)", [queue])
    ids = enqueue_many(conn, [{"name": "k", "queue": queue, "concurrency_key": key} for key in ("b", "a", "b", "a")])
    states = {
        r["id"]: r["state"]
        for r in conn.execute("SELECT id, state FROM treadle.jobs WHERE queue = %s", [queue]).fetchall()
    }
    assert [states[i] for i in ids] == ["available", "available", "blocked", "blocked"]


def test_concurrent_calls_with_keys_in_opposite_orders_both_finish(conn: Conn, queue: str) -> None:
    second = other_queue()
    conn.execute("SELECT treadle.set_queue(%s, key_limit => 1)", [queue])
    conn.execute("SELECT treadle.set_queue(%s, key_limit => 1)", [second])
    pairs = [(queue, "a"), (queue, "b"), (second, "a")]
    forward = [{"name": "f", "queue": q, "concurrency_key": k, "idempotency_key": f"f{k}"} for q, k in pairs]
    backward = [{"name": "b", "queue": q, "concurrency_key": k} for q, k in reversed(pairs)]
    errors: list[BaseException] = []
    with psycopg.connect(CITUS_URL, row_factory=dict_row) as first:
        enqueue_many(first, forward)  # holds its keys' slots until it commits

        def other() -> None:
            try:
                with psycopg.connect(CITUS_URL, row_factory=dict_row) as c:
                    c.execute("SET lock_timeout = '20s'")
                    enqueue_many(c, backward)
                    c.commit()
            except BaseException as e:  # reported below
                errors.append(e)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(0.5)
        enqueue_many(first, list(reversed(forward)))  # the same keys again, in the other order
        first.commit()
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    rows = conn.execute(
        "SELECT queue, concurrency_key AS key, count(*)::int AS n FROM treadle.jobs "
        "WHERE queue = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 2",
        [[queue, second]],
    ).fetchall()
    assert sorted((r["queue"], r["key"], r["n"]) for r in rows) == sorted((q, k, 2) for q, k in pairs)


def test_a_batch_takes_its_keys_queue_by_queue_in_order(conn: Conn) -> None:
    """A holds key k in the first queue; B's batch names the second queue first, then the
    first: B waits on the first queue before it writes the second, so A's later insert of
    k in the second queue does not wait on B (in input order, the two would deadlock)."""
    first, second = sorted([other_queue(), other_queue()])
    errors: list[BaseException] = []
    with psycopg.connect(CITUS_URL, row_factory=dict_row) as a:
        enqueue_many(a, [{"name": "a", "queue": first, "idempotency_key": "k"}])

        def other() -> None:
            try:
                with psycopg.connect(CITUS_URL, row_factory=dict_row) as b:
                    enqueue_many(b, [{"name": "b", "queue": q, "idempotency_key": "k"} for q in (second, first)])
                    b.commit()
            except BaseException as e:  # reported below
                errors.append(e)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(1.0)  # B now waits for A's key in the first queue
        a.execute("SET lock_timeout = '10s'")
        (held,) = enqueue_many(a, [{"name": "a", "queue": second, "idempotency_key": "k"}])
        a.commit()
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    rows = conn.execute(
        "SELECT queue, name FROM treadle.jobs WHERE queue = ANY(%s) ORDER BY queue", [[first, second]]
    ).fetchall()
    assert rows == [{"queue": first, "name": "a"}, {"queue": second, "name": "a"}]
    assert conn.execute("SELECT id FROM treadle.jobs WHERE queue = %s", [second]).fetchone() == {"id": held}


def test_enqueue_arrays_lands_each_job_in_its_queue(conn: Conn, queue: str) -> None:
    second = other_queue()
    rows = conn.execute(
        "SELECT id FROM treadle.enqueue_arrays(%s::text[], queue => %s::text[], idempotency_key => %s::text[]) AS id",
        [["a", "b", "c"], [queue, second, queue], ["k", None, "k"]],
    ).fetchall()
    ids = [int(r["id"]) for r in rows]
    assert ids[0] == ids[2] != ids[1]
    found = conn.execute(
        "SELECT queue, name FROM treadle.jobs WHERE queue = ANY(%s) ORDER BY name", [[queue, second]]
    ).fetchall()
    assert found == [{"queue": queue, "name": "a"}, {"queue": second, "name": "b"}]


def test_enqueue_of_a_job_with_a_concurrency_key(conn: Conn, queue: str) -> None:
    row = conn.execute("SELECT treadle.enqueue('k', queue => %s, concurrency_key => 'a') AS id", [queue]).fetchone()
    assert row is not None
    assert conn.execute("SELECT state FROM treadle.jobs WHERE queue = %s", [queue]).fetchone() == {"state": "available"}


def test_the_python_clients_enqueue_many_lands_each_job_in_its_queue(conn: Conn, queue: str) -> None:
    """The client sends its columns as arrays (args and meta as one JSON array each) to
    treadle.enqueue_arrays; on the cluster each job lands in its queue with its values."""
    second = other_queue()
    jobs = [
        {"name": f"c{i}", "queue": (queue, second)[i % 2], "args": {"i": i, "s": "x" * i}, "priority": i % 3}
        for i in range(50)
    ]
    ids = treadle.enqueue_many(conn, jobs)
    assert len(ids) == len(set(ids)) == 50
    for job_id, spec in zip(ids, jobs, strict=True):
        row = conn.execute(
            "SELECT name, args, priority, state FROM treadle.jobs WHERE queue = %s AND id = %s",
            [spec["queue"], job_id],
        ).fetchone()
        assert row == {"name": spec["name"], "args": spec["args"], "priority": spec["priority"], "state": "available"}
