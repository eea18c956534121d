"""Idempotency keys under concurrency: one row per key, every caller gets its id, no error.

Also the two orders one transaction can meet another's uncommitted insert of a key:
the waiter gets the holder's id when it commits, and inserts its own when it rolls back.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, WaitBlocked

CONNECTIONS = 50
CALLS = 1000


def run_on_pool(
    conns: list[psycopg.Connection], calls: int, call: Callable[[psycopg.Connection, int], object]
) -> list[Any]:
    """Run call(conn, i) for i in range(calls) on a thread per connection, each call in its own transaction."""
    free: queue.Queue[psycopg.Connection] = queue.Queue()
    for conn in conns:
        free.put(conn)

    def one(i: int) -> object:
        conn = free.get()
        try:
            with conn.transaction():
                return call(conn, i)
        finally:
            free.put(conn)

    with ThreadPoolExecutor(len(conns)) as pool:
        return list(pool.map(one, range(calls)))


def test_a_thousand_concurrent_enqueues_of_one_key_make_one_row(connect: Connect) -> None:
    conns = [connect() for _ in range(CONNECTIONS)]

    def enqueue(conn: psycopg.Connection, i: int) -> int:
        row = conn.execute(
            "select treadle.enqueue('charge', %s, idempotency_key => 'order-42')", (Jsonb({"caller": i}),)
        ).fetchone()
        # a little more work in the same transaction keeps the key's insert uncommitted for longer
        conn.execute("select count(*) from treadle.jobs")
        assert row is not None
        return int(row[0])

    ids = run_on_pool(conns, CALLS, enqueue)

    rows = conns[0].execute("select id, args from treadle.jobs where idempotency_key = 'order-42'").fetchall()
    assert len(rows) == 1
    assert set(ids) == {rows[0][0]}
    assert conns[0].execute("select count(*) from treadle.jobs").fetchone() == (1,)


def test_concurrent_enqueue_many_with_shared_keys(connect: Connect) -> None:
    """Batches naming the same keys in different orders: one row per key, every id agrees, no deadlock."""
    conns = [connect() for _ in range(20)]
    keys = [f"k{n}" for n in range(25)]

    def enqueue_many(conn: psycopg.Connection, i: int) -> dict[str, int]:
        order = keys[:]
        random.Random(i).shuffle(order)
        specs = [{"name": "sync", "idempotency_key": k, "args": {"by": i}} for k in order]
        specs.append({"name": "unkeyed", "args": {"by": i}})
        ids = [r[0] for r in conn.execute("select * from treadle.enqueue_many(%s)", (Jsonb(specs),)).fetchall()]
        assert len(ids) == len(specs)
        return dict(zip([*order, "unkeyed"], ids, strict=True))

    results = run_on_pool(conns, 200, enqueue_many)

    held: dict[str, int] = dict(
        conns[0].execute("select idempotency_key, id from treadle.jobs where idempotency_key is not null").fetchall()
    )
    assert sorted(held) == sorted(keys)
    for result in results:
        assert {k: result[k] for k in keys} == held
    unkeyed = {result["unkeyed"] for result in results}
    assert len(unkeyed) == 200
    assert conns[0].execute("select count(*) from treadle.jobs where name = 'unkeyed'").fetchone() == (200,)


def test_concurrent_start_workflow_with_one_key_starts_one_run(connect: Connect) -> None:
    conns = [connect() for _ in range(20)]

    def start(conn: psycopg.Connection, i: int) -> int:
        row = conn.execute(
            "select treadle.start_workflow('onboard', %s, array['a', 'b'], idempotency_key => 'user-7')",
            (Jsonb({"caller": i}),),
        ).fetchone()
        assert row is not None
        return int(row[0])

    ids = run_on_pool(conns, 200, start)

    assert len(set(ids)) == 1
    assert conns[0].execute("select count(*) from treadle.workflow_runs").fetchone() == (1,)
    assert conns[0].execute("select count(*) from treadle.jobs where workflow_run_id = %s", (ids[0],)).fetchone() == (
        1,
    )


class Waiter(threading.Thread):
    """Runs one statement on its own connection and keeps the first column of every row."""

    def __init__(self, conn: psycopg.Connection, sql: str, params: tuple[Any, ...] = ()) -> None:
        super().__init__(daemon=True)
        self.conn, self.sql, self.params = conn, sql, params
        self.pid = conn.info.backend_pid
        self.result: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = [r[0] for r in self.conn.execute(self.sql, self.params).fetchall()]
        except BaseException as exc:  # handed to the test thread
            self.error = exc

    def outcome(self) -> list[Any]:
        self.join(60)
        assert not self.is_alive(), "the waiting statement never returned"
        if self.error is not None:
            raise self.error
        return self.result


ENQUEUE_KEYED = "select treadle.enqueue('mail', idempotency_key => 'race-key')"
ENQUEUE_MANY_KEYED = (
    "select * from treadle.enqueue_many("
    """'[{"name": "other"}, {"name": "mail", "idempotency_key": "race-key"}, {"name": "third"}]')"""
)


def hold_key(connect: Connect) -> tuple[psycopg.Connection, int]:
    """A transaction that has inserted the key and not committed."""
    holder = connect(autocommit=False)
    row = holder.execute(ENQUEUE_KEYED).fetchone()
    assert row is not None
    return holder, row[0]


def test_a_caller_waiting_on_an_uncommitted_key_gets_its_id_after_commit(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    holder, held_id = hold_key(connect)
    waiter = Waiter(connect(), ENQUEUE_KEYED)
    waiter.start()
    wait_until_blocked(waiter.pid)
    holder.commit()
    assert waiter.outcome() == [held_id]
    assert holder.execute("select count(*) from treadle.jobs").fetchone() == (1,)


def test_a_caller_waiting_on_an_uncommitted_key_inserts_its_own_after_rollback(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    holder, held_id = hold_key(connect)
    waiter = Waiter(connect(), ENQUEUE_KEYED)
    waiter.start()
    wait_until_blocked(waiter.pid)
    holder.rollback()
    (own_id,) = waiter.outcome()
    assert own_id != held_id
    rows = holder.execute("select id from treadle.jobs where idempotency_key = 'race-key'").fetchall()
    assert rows == [(own_id,)]


def test_enqueue_many_waiting_on_an_uncommitted_key_gets_its_id_after_commit(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    holder, held_id = hold_key(connect)
    waiter = Waiter(connect(), ENQUEUE_MANY_KEYED)
    waiter.start()
    wait_until_blocked(waiter.pid)
    holder.commit()
    other, keyed, third = waiter.outcome()
    assert keyed == held_id
    assert len({other, keyed, third}) == 3
    names = holder.execute("select name from treadle.jobs order by id").fetchall()
    assert sorted(n for (n,) in names) == ["mail", "other", "third"]


def test_enqueue_many_waiting_on_an_uncommitted_key_inserts_its_own_after_rollback(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    holder, held_id = hold_key(connect)
    waiter = Waiter(connect(), ENQUEUE_MANY_KEYED)
    waiter.start()
    wait_until_blocked(waiter.pid)
    holder.rollback()
    other, keyed, third = waiter.outcome()
    assert keyed != held_id
    rows = holder.execute("select id, name from treadle.jobs order by id").fetchall()
    assert rows == sorted([(other, "other"), (keyed, "mail"), (third, "third")])


def test_start_workflow_waiting_on_an_uncommitted_key_gets_its_run_after_commit(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    start = "select treadle.start_workflow('w', steps => array['s'], idempotency_key => 'run-key')"
    holder = connect(autocommit=False)
    row = holder.execute(start).fetchone()
    assert row is not None
    waiter = Waiter(connect(), start)
    waiter.start()
    wait_until_blocked(waiter.pid)
    holder.commit()
    assert waiter.outcome() == [row[0]]
    assert holder.execute("select count(*) from treadle.jobs").fetchone() == (1,)


def merge_on_pool(conns: list[psycopg.Connection], calls: int, sql: str) -> tuple[list[int], list[int]]:
    """Run sql (parameters: args, i) `calls` times at once; the ids and the order in which calls held the key.

    A call that has merged into (or inserted) the key's job holds its row until it commits,
    so the order in which calls return from the statement is the order they commit in.
    """
    order: list[int] = []
    lock = threading.Lock()

    def call(conn: psycopg.Connection, i: int) -> int:
        row = conn.execute(sql, (Jsonb({"q": f"typed {i}", "items": [i]}),)).fetchone()
        assert row is not None
        with lock:
            order.append(i)
        conn.execute("select count(*) from treadle.jobs")  # hold the key a little longer
        return int(row[0])

    return run_on_pool(conns, calls, call), order


def test_a_thousand_concurrent_debounces_leave_one_waiting_job_with_the_last_args(connect: Connect) -> None:
    conns = [connect() for _ in range(CONNECTIONS)]
    ids, order = merge_on_pool(
        conns,
        CALLS,
        "select treadle.enqueue('search', %s, run_at => treadle.now() + interval '1 second',"
        " idempotency_key => 'search:ada', on_conflict => 'replace')",
    )
    rows = conns[0].execute("select id, args, state from treadle.jobs where idempotency_key = 'search:ada'").fetchall()
    assert len(rows) == 1
    job_id, args, state = rows[0]
    assert set(ids) == {job_id}
    assert state == "available"
    assert args == {"q": f"typed {order[-1]}", "items": [order[-1]]}


def test_a_thousand_concurrent_appends_keep_every_element_once(connect: Connect) -> None:
    """Half the calls by enqueue, half by enqueue_many: one job whose array holds every call's element."""
    conns = [connect() for _ in range(CONNECTIONS)]

    def call(conn: psycopg.Connection, i: int) -> int:
        args = Jsonb({"items": [i]})
        if i % 2:
            row = conn.execute(
                "select treadle.enqueue('digest', %s, idempotency_key => 'digest:ada', on_conflict => 'append')",
                (args,),
            ).fetchone()
        else:
            spec = [
                {"name": "digest", "args": {"items": [i]}, "idempotency_key": "digest:ada", "on_conflict": "append"}
            ]
            row = conn.execute("select * from treadle.enqueue_many(%s)", (Jsonb(spec),)).fetchone()
        assert row is not None
        return int(row[0])

    ids = run_on_pool(conns, CALLS, call)
    rows = conns[0].execute("select id, args from treadle.jobs where idempotency_key = 'digest:ada'").fetchall()
    assert len(rows) == 1
    assert set(ids) == {rows[0][0]}
    assert sorted(rows[0][1]["items"]) == list(range(CALLS))


def test_debounces_while_a_worker_claims_never_change_a_running_job(connect: Connect) -> None:
    """A claimer takes the key's job again and again while callers debounce it.

    Every claimed job keeps the args it was claimed with, at most one job waits with
    the key, and the last call's args are on the newest job.
    """
    conns = [connect() for _ in range(20)]
    claimer = connect()
    done = threading.Event()
    claimed: dict[int, Any] = {}

    def claim_loop() -> None:
        while not done.is_set():
            for job in claimer.execute(
                "select id, args, lease_token from treadle.claim('w', array['default'])"
            ).fetchall():
                claimed[job[0]] = job[1]
                claimer.execute("select treadle.complete(%s, %s)", (job[0], job[2]))

    thread = threading.Thread(target=claim_loop)
    thread.start()
    try:
        ids, order = merge_on_pool(
            conns, 300, "select treadle.enqueue('search', %s, idempotency_key => 'search:bo', on_conflict => 'replace')"
        )
    finally:
        done.set()
        thread.join()
    rows = (
        conns[0]
        .execute("select id, args, state, key_scope from treadle.jobs where idempotency_key = 'search:bo' order by id")
        .fetchall()
    )
    assert {r[0] for r in rows} == set(ids)
    assert [r for r in rows if r[2] == "available" and r[3] != "released"] == [r for r in rows if r[2] == "available"]
    assert len([r for r in rows if r[2] == "available"]) <= 1
    for job_id, args, state, _ in rows:
        if job_id in claimed:
            assert state == "completed"
            assert args == claimed[job_id]
    assert rows[-1][1] == {"q": f"typed {order[-1]}", "items": [order[-1]]}
    assert len(claimed) > 1, "the claimer never met a running holder"
