"""enqueue's common call runs on a cursor kept per connection: threads that share the
connection, the caller's transactions, its cursors and settings, and a dropped connection."""

from __future__ import annotations

import gc
import sys
import threading
import time
import warnings
import weakref
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

import treadle


def test_threads_sharing_a_connection_each_get_their_own_job(dsn: str) -> None:
    threads, calls = 8, 150
    start = threading.Barrier(threads)
    returned: dict[int, list[tuple[int, int]]] = {t: [] for t in range(threads)}
    errors: list[BaseException] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        treadle.enqueue(conn, "warm")  # the kept cursor exists before the threads begin

        def produce(t: int) -> None:
            try:
                start.wait()
                for i in range(calls):
                    returned[t].append((treadle.enqueue(conn, "shared", {"t": t, "i": i}), i))
            except BaseException as error:  # reported below
                errors.append(error)

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # threads take turns between any two steps of a call
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            sys.setswitchinterval(interval)
        assert errors == []
        stored = {
            job_id: args for job_id, args in conn.execute("SELECT id, args FROM treadle.jobs WHERE name = 'shared'")
        }
    ids = [job_id for t in returned for job_id, _ in returned[t]]
    assert len(ids) == len(set(ids)) == threads * calls == len(stored)
    # each call got back the id of its own job, never another thread's
    for t, pairs in returned.items():
        for job_id, i in pairs:
            assert stored[job_id] == {"t": t, "i": i}


def test_a_transaction_rolled_back_or_failed_leaves_the_next_call_working(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:  # the caller owns its transactions
        gone = treadle.enqueue(conn, "gone")
        conn.rollback()
        with pytest.raises(treadle.InvalidArgument) as refused:
            treadle.enqueue(conn, "x" * 201)  # refused by the server: the transaction has failed
        assert refused.value.sqlstate == "22023"
        assert conn.info.transaction_status is TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            treadle.enqueue(conn, "in a failed transaction")
        conn.rollback()
        kept = treadle.enqueue(conn, "kept")
        status: TransactionStatus = conn.info.transaction_status
        assert status is TransactionStatus.INTRANS  # treadle never commits
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as other:
        assert other.execute("SELECT id, name FROM treadle.jobs ORDER BY id").fetchall() == [(kept, "kept")]
        assert gone != kept


def test_the_callers_connection_and_cursors_keep_their_state(conn: psycopg.Connection[Any]) -> None:
    conn.row_factory = dict_row
    cur = conn.cursor()
    cur.execute("SELECT n FROM generate_series(1, 3) AS n")
    assert cur.fetchone() == {"n": 1}
    job_id = treadle.enqueue(conn, "between")
    assert isinstance(job_id, int)
    # the caller's cursor still reads its own result, with its own row factory
    assert cur.fetchall() == [{"n": 2}, {"n": 3}]
    assert conn.execute("SELECT 7 AS seven").fetchone() == {"seven": 7}
    assert treadle.enqueue(conn, "after") > job_id


def test_a_changed_client_encoding_is_followed(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        treadle.enqueue(conn, "first")
        conn.execute("SET client_encoding TO 'LATIN1'")
        job_id = treadle.enqueue(conn, "café")  # text is sent in the connection's encoding
    with psycopg.connect(dsn, autocommit=True) as other:
        assert other.execute("SELECT name FROM treadle.jobs WHERE id = %s", [job_id]).fetchone() == ("café",)


def test_a_dropped_connection_is_freed_at_once(dsn: str) -> None:
    conn = psycopg.connect(dsn, autocommit=True)
    treadle.enqueue(conn, "one")
    pid = conn.info.backend_pid
    dropped = weakref.ref(conn)
    gc.disable()  # freed by its reference count: nothing of treadle's holds it or makes a cycle with it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # psycopg's word on an unclosed connection
            del conn
        assert dropped() is None
    finally:
        gc.enable()
    with psycopg.connect(dsn, autocommit=True) as other:  # and its session ended
        deadline = time.monotonic() + 10
        while other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() != (0,):
            assert time.monotonic() < deadline, "the dropped connection's session is still open"
            time.sleep(0.05)


def test_a_closed_connection_raises_as_psycopg_does(dsn: str) -> None:
    conn = psycopg.connect(dsn, autocommit=True)
    treadle.enqueue(conn, "one")
    conn.close()
    with pytest.raises(psycopg.OperationalError, match="closed"):
        treadle.enqueue(conn, "two")
