"""retry_many and cancel_many: a batch to a transaction, the count of what changed, checked ids."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle
from tests.client.producer_support import SqlWorker
from tests.conftest import as_role


def states(conn: psycopg.Connection[Any], ids: list[int]) -> list[str]:
    rows = conn.execute("SELECT id, state FROM treadle.jobs WHERE id = ANY(%s)", [ids]).fetchall()
    found = dict(rows)
    return [found.get(job_id, "gone") for job_id in ids]


def discarded(conn: psycopg.Connection[Any], sql_worker: SqlWorker, count: int) -> list[int]:
    ids = [treadle.enqueue(conn, f"broken-{n}", max_attempts=1) for n in range(count)]
    for job_id in ids:
        assert sql_worker.fail(job_id, "boom") == "discarded"
    return ids


def test_retry_many_over_a_mix_of_states(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    failed = discarded(conn, sql_worker, 2)
    cancelled = treadle.enqueue(conn, "stopped")
    sql_worker.cancel(cancelled)
    waiting = treadle.enqueue(conn, "waiting")
    done = treadle.enqueue(conn, "done")
    sql_worker.complete(done)
    running = treadle.enqueue(conn, "running")
    sql_worker.claim(running)
    ids = [*failed, cancelled, waiting, done, running]
    assert treadle.retry_many(conn, ids) == 3
    assert states(conn, ids) == ["available", "available", "available", "available", "completed", "running"]
    assert treadle.retry_many(conn, ids) == 0  # nothing left to retry


def test_cancel_many_over_a_mix_of_states(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    waiting = [treadle.enqueue(conn, "waiting") for _ in range(2)]
    running = treadle.enqueue(conn, "running")
    sql_worker.claim(running)
    done = treadle.enqueue(conn, "done")
    sql_worker.complete(done)
    ids = [*waiting, running, done]
    assert treadle.cancel_many(conn, ids) == 3  # two cancelled, one asked to stop
    assert states(conn, ids) == ["cancelled", "cancelled", "running", "completed"]
    assert conn.execute("SELECT cancel_requested FROM treadle.jobs WHERE id = %s", [running]).fetchone() == (True,)
    assert treadle.cancel_many(conn, ids) == 0  # the running one's cancel is asked already


def test_no_ids_send_nothing_and_unknown_ids_change_nothing(conn: psycopg.Connection[Any]) -> None:
    reports: list[tuple[int, int]] = []
    assert treadle.retry_many(conn, [], on_batch=lambda jobs, changed: reports.append((jobs, changed))) == 0
    assert treadle.cancel_many(conn, iter(()), on_batch=lambda jobs, changed: reports.append((jobs, changed))) == 0
    assert reports == []
    assert treadle.retry_many(conn, [999_001, 999_002], on_batch=lambda j, c: reports.append((j, c))) == 0
    assert treadle.cancel_many(conn, (999_003,)) == 0
    assert reports == [(2, 0)]


def test_a_repeated_id_changes_once(conn: psycopg.Connection[Any]) -> None:
    job_id = treadle.enqueue(conn, "x")
    assert treadle.cancel_many(conn, [job_id, job_id, job_id]) == 1
    assert treadle.retry_many(conn, [job_id, job_id]) == 1


def test_each_batch_commits_before_the_next_begins(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    ids = discarded(conn, sql_worker, 5)
    seen: list[tuple[int, int, int]] = []
    with psycopg.connect(dsn, autocommit=True) as other:

        def on_batch(jobs: int, changed: int) -> None:
            # another session sees each batch as soon as it is reported
            row = other.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'available'").fetchone()
            assert row is not None
            seen.append((jobs, changed, row[0]))

        assert treadle.retry_many(conn, ids, batch_size=2, on_batch=on_batch) == 5
    assert seen == [(2, 2, 2), (2, 2, 4), (1, 1, 5)]


def test_a_connection_outside_autocommit_commits_each_batch_too(dsn: str, sql_worker: SqlWorker) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup:
        ids = [treadle.enqueue(setup, "x") for _ in range(3)]
    with psycopg.connect(dsn) as conn:  # idle: each batch begins and commits its own transaction
        assert treadle.cancel_many(conn, ids, batch_size=2) == 3
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with psycopg.connect(dsn) as conn:
        assert states(conn, ids) == ["cancelled"] * 3


def test_inside_the_callers_transaction_the_batches_are_its_statements(dsn: str, conn: psycopg.Connection[Any]) -> None:
    ids = [treadle.enqueue(conn, "x") for _ in range(3)]
    with psycopg.connect(dsn) as tx:
        tx.execute("SELECT 1")  # a transaction is open
        assert treadle.cancel_many(tx, ids, batch_size=2) == 3
        assert states(conn, ids) == ["available"] * 3  # nothing committed yet
        tx.rollback()
    assert states(conn, ids) == ["available"] * 3


def test_an_iterator_is_read_a_batch_at_a_time(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    ids = discarded(conn, sql_worker, 5)
    events: list[str] = []

    def lazily() -> Iterator[int]:
        for job_id in ids:
            events.append(f"read {job_id - ids[0]}")
            yield job_id

    changed = treadle.retry_many(conn, lazily(), batch_size=2, on_batch=lambda jobs, _: events.append(f"did {jobs}"))
    assert changed == 5
    assert events == ["read 0", "read 1", "did 2", "read 2", "read 3", "did 2", "read 4", "did 1"]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (None, "ids must be a list of job ids, not NoneType"),
        (7, "ids must be a list of job ids, not int"),
        ("12", "ids must be a list of job ids, not str"),
        ({1: 2}, "ids must be a list of job ids, not dict"),
        ([1, "2"], "ids[1] must be an integer, not str"),
        ([1, None], "ids[1] must be an integer, not NoneType"),
        ([1.0], "ids[0] must be an integer, not float"),
        ([True], "ids[0] must be an integer, not bool"),
        ([2**63], "ids[0] must be between"),
    ],
)
def test_bad_ids_are_refused_before_anything_is_sent(conn: psycopg.Connection[Any], ids: Any, message: str) -> None:
    job_id = treadle.enqueue(conn, "x")
    for act in (treadle.retry_many, treadle.cancel_many):
        with pytest.raises(treadle.InvalidArgument) as refused:
            act(conn, [job_id, *ids] if isinstance(ids, list) else ids, batch_size=1)
        expected = message.replace("ids[1]", "ids[2]").replace("ids[0]", "ids[1]")
        assert str(refused.value).startswith(expected)
    assert states(conn, [job_id]) == ["available"]  # the good id before the bad one was not cancelled


def test_a_bad_id_from_an_iterator_stops_at_its_batch(conn: psycopg.Connection[Any]) -> None:
    ids = [treadle.enqueue(conn, "x") for _ in range(3)]
    given: list[Any] = [*ids, "4"]
    with pytest.raises(treadle.InvalidArgument, match=r"ids\[3\] must be an integer, not str"):
        treadle.cancel_many(conn, iter(given), batch_size=2)
    # the batch before it committed; its own batch was never sent
    assert states(conn, ids) == ["cancelled", "cancelled", "available"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be at least 1, got 0"),
        ({"batch_size": "10"}, "batch_size must be an integer, not str"),
        ({"on_batch": 3}, "on_batch must be a function or None, not int"),
        ({"statement_timeout": 5}, "statement_timeout must be a datetime.timedelta or None, not int"),
        ({"statement_timeout": timedelta(0)}, "statement_timeout must be positive"),
    ],
)
def test_bad_options_are_refused(module_conn: psycopg.Connection[Any], options: dict[str, Any], message: str) -> None:
    with pytest.raises(treadle.InvalidArgument, match=message):
        treadle.retry_many(module_conn, [1], **options)


def test_a_batch_past_its_statement_timeout_rolls_back_alone(dsn: str, conn: psycopg.Connection[Any]) -> None:
    ids = [treadle.enqueue(conn, "x") for _ in range(3)]
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM treadle.jobs WHERE id = %s FOR UPDATE", [ids[2]])  # locked until rollback
        # 1 s: the first batch finishes inside it even on a loaded machine
        with pytest.raises(psycopg.errors.QueryCanceled):
            treadle.cancel_many(conn, ids, batch_size=2, statement_timeout=timedelta(seconds=1))
        holder.rollback()
    assert states(conn, ids) == ["cancelled", "cancelled", "available"]
    assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)  # the batch's own, not the session's


def test_a_tenants_job_outside_its_queues_stops_the_batch(
    dsn: str, conn: psycopg.Connection[Any], make_role: Callable[[str], str]
) -> None:
    tenant = make_role("tenant")
    conn.execute("SELECT treadle.grant_admin(%s), treadle.set_tenant(%s, 'mine')", [tenant, tenant])
    mine = [treadle.enqueue(conn, "x", queue="mine") for _ in range(2)]
    theirs = treadle.enqueue(conn, "x", queue="theirs")
    with psycopg.connect(as_role(dsn, tenant), autocommit=True) as as_tenant:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            treadle.cancel_many(as_tenant, [*mine, theirs], batch_size=2)
    assert states(conn, [*mine, theirs]) == ["cancelled", "cancelled", "available"]


def test_async_connections(dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    ids = discarded(conn, sql_worker, 3)
    reports: list[tuple[int, int]] = []

    async def scenario() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            retried = await treadle.retry_many(aconn, ids, batch_size=2, on_batch=lambda j, c: reports.append((j, c)))
            cancelled = await treadle.cancel_many(aconn, ids)
            return retried, cancelled

    assert asyncio.run(scenario()) == (3, 3)
    assert reports == [(2, 2), (1, 1)]
    assert states(conn, ids) == ["cancelled"] * 3
