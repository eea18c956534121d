"""enqueue and enqueue_many: every option, and the job commits with the caller's transaction."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

import treadle
from tests.conftest import EXTENSION_VERSION


def row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    found = cur.execute("SELECT * FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
    assert found is not None
    return found


class Always:
    """Equal to everything, None included: a value that must be told apart from None by identity."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def count_jobs(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as other:
        found = other.execute("SELECT count(*) FROM treadle.jobs").fetchone()
    assert found is not None
    return int(found[0])


def test_defaults(conn: psycopg.Connection[Any]) -> None:
    job = row(conn, treadle.enqueue(conn, "send_email"))
    assert (job["name"], job["args"], job["queue"], job["priority"], job["max_attempts"]) == (
        "send_email",
        {},
        "default",
        0,
        25,
    )
    assert job["state"] == "available" and job["every"] is None and job["idempotency_key"] is None
    assert job["run_at"] == job["created_at"]


def test_every_option_is_stored(conn: psycopg.Connection[Any]) -> None:
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))
    job_id = treadle.enqueue(
        conn,
        "report",
        {"user": 7, "tags": ["a", "b"], "nested": {"x": None, "ok": True, "f": 1.5}},
        queue="reports",
        priority=-3,
        run_at=at,
        max_attempts=2,
        idempotency_key="report:7",
        every=timedelta(hours=1, microseconds=5),
    )
    job = row(conn, job_id)
    assert job["args"] == {"user": 7, "tags": ["a", "b"], "nested": {"x": None, "ok": True, "f": 1.5}}
    assert (job["queue"], job["priority"], job["run_at"], job["max_attempts"]) == ("reports", -3, at, 2)
    assert (job["idempotency_key"], job["every"]) == ("report:7", timedelta(hours=1, microseconds=5))


def test_timeout_and_backoff_are_stored(conn: psycopg.Connection[Any]) -> None:
    delays = [timedelta(seconds=10), timedelta(minutes=1, microseconds=7)]
    job_id = treadle.enqueue(conn, "sync", timeout=timedelta(minutes=2), backoff=delays)
    assert (row(conn, job_id)["timeout"], row(conn, job_id)["backoff"]) == (timedelta(minutes=2), delays)
    job = treadle.get_job(conn, job_id)
    assert job is not None and (job.timeout, job.backoff) == (timedelta(minutes=2), delays)
    plain = treadle.get_job(conn, treadle.enqueue(conn, "sync"))
    assert plain is not None and (plain.timeout, plain.backoff) == (None, None)


def test_enqueue_many_timeout_and_backoff(conn: psycopg.Connection[Any]) -> None:
    first, second = treadle.enqueue_many(
        conn,
        [
            {"name": "a", "timeout": timedelta(seconds=90), "backoff": (timedelta(seconds=1), timedelta(hours=1))},
            {"name": "b", "backoff": [timedelta(0)], "timeout": None},
        ],
    )
    assert (row(conn, first)["timeout"], row(conn, first)["backoff"]) == (
        timedelta(seconds=90),
        [timedelta(seconds=1), timedelta(hours=1)],
    )
    assert (row(conn, second)["timeout"], row(conn, second)["backoff"]) == (None, [timedelta(0)])


def test_args_may_be_an_array(conn: psycopg.Connection[Any]) -> None:
    assert row(conn, treadle.enqueue(conn, "x", [1, "two", [3]]))["args"] == [1, "two", [3]]


def test_a_delay_counts_from_the_database_clock(conn: psycopg.Connection[Any]) -> None:
    # the session's clock is moved: the delay must count from it, not from Python's clock
    conn.execute("SET treadle.now = '2030-01-01 00:00:00+00'")
    job = row(conn, treadle.enqueue(conn, "later", run_at=timedelta(minutes=5)))
    assert job["run_at"] == datetime(2030, 1, 1, 0, 5, tzinfo=timezone.utc)
    assert job["created_at"] == datetime(2030, 1, 1, tzinfo=timezone.utc)
    # without run_at the job is due at the database's now as well
    assert row(conn, treadle.enqueue(conn, "now"))["run_at"] == datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_idempotency_key_returns_the_holder(conn: psycopg.Connection[Any]) -> None:
    first = treadle.enqueue(conn, "charge", {"n": 1}, idempotency_key="charge:1")
    again = treadle.enqueue(conn, "charge", {"n": 2}, idempotency_key="charge:1")
    other = treadle.enqueue(conn, "charge", {"n": 3}, idempotency_key="charge:2")
    assert first == again != other
    assert row(conn, first)["args"] == {"n": 1}


def test_on_conflict_merges_into_the_waiting_holder(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET treadle.now = '2030-01-01 00:00:00+00'")
    debounced = treadle.enqueue(
        conn, "search", {"q": "a"}, run_at=timedelta(seconds=1), idempotency_key="s", on_conflict="replace"
    )
    conn.execute("SET treadle.now = '2030-01-01 00:00:00.5+00'")
    again = treadle.enqueue(
        conn, "search", {"q": "ab"}, run_at=timedelta(seconds=1), idempotency_key="s", on_conflict="replace"
    )
    assert again == debounced
    job = row(conn, debounced)
    assert (job["args"], job["run_at"]) == ({"q": "ab"}, datetime(2030, 1, 1, 0, 0, 1, 500000, tzinfo=timezone.utc))
    throttled = treadle.enqueue(
        conn, "t", {"v": 1}, run_at=timedelta(minutes=1), idempotency_key="t", on_conflict="replace_args"
    )
    treadle.enqueue(conn, "t", {"v": 2}, run_at=timedelta(minutes=5), idempotency_key="t", on_conflict="replace_args")
    assert (row(conn, throttled)["args"], row(conn, throttled)["run_at"]) == (
        {"v": 2},
        datetime(2030, 1, 1, 0, 1, 0, 500000, tzinfo=timezone.utc),
    )
    digest = treadle.enqueue(conn, "digest", {"events": [1]}, idempotency_key="d", on_conflict="append")
    ids = treadle.enqueue_many(
        conn,
        [
            {"name": "digest", "args": {"events": [2]}, "idempotency_key": "d", "on_conflict": "append"},
            {"name": "digest", "args": {"events": [3]}, "idempotency_key": "d", "on_conflict": "append"},
        ],
    )
    assert ids == [digest, digest]
    assert row(conn, digest)["args"] == {"events": [1, 2, 3]}


def test_unique_while_and_unique_period_are_stored(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET treadle.now = '2030-01-01 10:20:00+00'")
    job_id = treadle.enqueue(conn, "x", idempotency_key="k", unique_while="active", unique_period=timedelta(hours=1))
    assert (row(conn, job_id)["key_scope"], row(conn, job_id)["key_period"]) == (
        "active",
        datetime(2030, 1, 1, 10, tzinfo=timezone.utc),
    )
    (many_id,) = treadle.enqueue_many(
        conn, [{"name": "x", "idempotency_key": "m", "unique_while": "waiting", "unique_period": timedelta(days=1)}]
    )
    assert (row(conn, many_id)["key_scope"], row(conn, many_id)["key_period"]) == (
        "waiting",
        datetime(2030, 1, 1, tzinfo=timezone.utc),
    )
    conn.execute("SET treadle.now = '2030-01-01 11:00:00+00'")
    assert treadle.enqueue(conn, "x", idempotency_key="k", unique_period=timedelta(hours=1)) != job_id


@pytest.mark.parametrize(
    ("options", "sqlstate"),
    [
        ({"idempotency_key": "k", "on_conflict": "merge"}, "22023"),
        ({"idempotency_key": "k", "unique_while": "forever"}, "22023"),
        ({"idempotency_key": "k", "unique_period": timedelta(0)}, "22023"),
        ({"on_conflict": "replace"}, "22023"),
    ],
)
def test_bad_key_options_are_refused(conn: psycopg.Connection[Any], options: Any, sqlstate: str) -> None:
    with pytest.raises(treadle.InvalidArgument) as refused:
        treadle.enqueue(conn, "x", **options)
    assert refused.value.sqlstate == sqlstate
    with pytest.raises(treadle.InvalidArgument, match="on_conflict must be a string"):
        treadle.enqueue(conn, "x", idempotency_key="k", on_conflict=None)  # type: ignore[call-overload]
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


def test_commit_keeps_the_job_with_the_callers_row(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:  # not autocommit: the caller owns the transaction
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        job_id = treadle.enqueue(conn, "receipt", {"order": 1})
        # treadle neither committed nor ended the transaction
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        assert count_jobs(dsn) == 0
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as other:
        assert other.execute("SELECT count(*) FROM orders").fetchone() == (1,)
        assert other.execute("SELECT name FROM treadle.jobs WHERE id = %s", [job_id]).fetchone() == ("receipt",)


def test_rollback_leaves_no_job(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            treadle.enqueue(conn, "receipt", {"order": 1})
            treadle.enqueue_many(conn, [{"name": "a"}, {"name": "b"}])
            treadle.start_workflow(conn, "flow", steps=["one"])
            raise RuntimeError("the caller changes its mind")
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == (0,)


def test_async_connection_commit_and_rollback(dsn: str) -> None:
    async def scenario() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            kept = await treadle.enqueue(aconn, "kept", {"a": 1}, queue="q")
            assert aconn.info.transaction_status == TransactionStatus.INTRANS
            await aconn.commit()
            dropped = await treadle.enqueue(aconn, "dropped")
            await aconn.rollback()
            return kept, dropped

    kept, dropped = asyncio.run(scenario())
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT id, name, queue FROM treadle.jobs").fetchall() == [(kept, "kept", "q")]
    assert dropped != kept


def test_async_enqueue_many_sends_the_columns_as_the_sync_call_does(dsn: str) -> None:
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    jobs: list[dict[str, Any]] = [
        {"name": "w", "args": {"k": 1}},
        {"name": "v", "priority": 3, "run_at": at, "meta": {"m": 1}},
        {"name": "u"},
    ]

    async def scenario() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await treadle.enqueue_many(aconn, jobs)

    ids = asyncio.run(scenario())
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = [(r["name"], r["args"], r["priority"], r["meta"]) for r in (row(conn, job_id) for job_id in ids)]
        assert row(conn, ids[1])["run_at"] == at
    assert found == [("w", {"k": 1}, 0, None), ("v", {}, 3, {"m": 1}), ("u", {}, 0, None)]


def test_async_calls_return_awaitables(dsn: str) -> None:
    async def scenario() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            job_id = await treadle.enqueue(aconn, "x")
            ids = await treadle.enqueue_many(aconn, [{"name": "y"}, {"name": "z", "run_at": timedelta(hours=1)}])
            run_id = await treadle.start_workflow(aconn, "flow", {"i": 1}, steps=["a", "b"])
            return [
                await treadle.version(aconn),
                (await treadle.get_job(aconn, job_id)),
                ids,
                await treadle.workflow_results(aconn, run_id),
                await treadle.cancel(aconn, job_id),
                await treadle.retry(aconn, job_id),
                await treadle.cancel_workflow(aconn, run_id),
                await treadle.get_job(aconn, 10**12),
            ]

    version, job, ids, results, cancelled, retried, run_cancelled, missing = asyncio.run(scenario())
    assert version == EXTENSION_VERSION
    assert isinstance(job, treadle.Job) and job.name == "x"
    assert len(ids) == 2 and ids[0] < ids[1]
    assert (results, cancelled, retried, run_cancelled, missing) == ({}, True, True, True, None)


# -- enqueue_many ------------------------------------------------------------------------


def test_enqueue_many_returns_ids_in_input_order(conn: psycopg.Connection[Any]) -> None:
    ids = treadle.enqueue_many(conn, ({"name": f"job{i}", "args": {"i": i}} for i in range(5)))
    names = [row(conn, job_id)["name"] for job_id in ids]
    assert names == [f"job{i}" for i in range(5)]
    assert [row(conn, job_id)["args"] for job_id in ids] == [{"i": i} for i in range(5)]


def test_enqueue_many_options_and_conversions(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET treadle.now = '2030-01-01 00:00:00+00'")
    at = datetime(2031, 2, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    first, second, third = treadle.enqueue_many(
        conn,
        [
            {
                "name": "a",
                "queue": "q",
                "priority": 5,
                "max_attempts": 3,
                "run_at": at,
                "every": timedelta(days=1, seconds=2, microseconds=3),
            },
            {"name": "b", "run_at": timedelta(minutes=10), "args": ["x"]},
            {"name": "c", "run_at": None, "every": None, "idempotency_key": None, "args": None},
        ],
    )
    a, b, c = row(conn, first), row(conn, second), row(conn, third)
    assert (a["queue"], a["priority"], a["max_attempts"], a["run_at"]) == ("q", 5, 3, at)
    assert a["every"] == timedelta(days=1, seconds=2, microseconds=3)
    assert b["run_at"] == datetime(2030, 1, 1, 0, 10, tzinfo=timezone.utc) and b["args"] == ["x"]
    assert (c["run_at"], c["args"], c["queue"]) == (datetime(2030, 1, 1, tzinfo=timezone.utc), {}, "default")


def test_enqueue_many_keeps_each_jobs_values_in_a_large_mixed_batch(conn: psycopg.Connection[Any]) -> None:
    # plain jobs, jobs with options, args left out or None, a dict subclass, a backslash
    # before "u0000" in text, meta on some: every job gets its own values back
    jobs: list[dict[str, Any]] = []
    for i in range(3000):
        job: dict[str, Any] = {"name": f"n{i % 7}"}
        if i % 5:
            job["args"] = {"i": i, "s": "a\\u0000b"} if i == 1234 else [i] if i % 3 == 0 else {"i": i}
        elif i % 10 == 0:
            job["args"] = None
        if i % 11 == 0:
            job |= {"queue": f"q{i % 3}", "priority": i % 4, "meta": {"m": i}}
        if i == 2999:
            job["args"] = OrderedDict([("z", 1), ("a", [None, True, 1.5])])
        jobs.append(job)
    ids = treadle.enqueue_many(conn, jobs)
    assert len(ids) == 3000 and len(set(ids)) == 3000
    cur = conn.cursor()
    cur.execute("SELECT id, name, args, queue, priority, meta FROM treadle.jobs WHERE id = ANY(%s)", [ids])
    stored = {r[0]: r[1:] for r in cur.fetchall()}
    for job_id, job in zip(ids, jobs, strict=True):
        args = job.get("args")
        expected = (
            job["name"],
            {} if args is None else dict(args) if isinstance(args, OrderedDict) else args,
            job.get("queue", "default"),
            job.get("priority", 0),
            job.get("meta"),
        )
        assert stored[job_id] == expected, job


def test_enqueue_many_of_more_json_than_one_jsonb_document_holds_well(conn: psycopg.Connection[Any]) -> None:
    # past 32 MiB of args the batch goes as a jsonb array, element by element: same jobs, same order
    ids = treadle.enqueue_many(conn, [{"name": "big", "args": {"i": i, "s": "x" * 1_000_000}} for i in range(35)])
    cur = conn.cursor()
    cur.execute("SELECT id, args->'i', length(args->>'s') FROM treadle.jobs WHERE id = ANY(%s) ORDER BY id", [ids])
    assert sorted(ids) == ids and cur.fetchall() == [(job_id, i, 1_000_000) for i, job_id in enumerate(ids)]


def test_enqueue_many_idempotency_keys(conn: psycopg.Connection[Any]) -> None:
    held = treadle.enqueue(conn, "x", idempotency_key="held")
    ids = treadle.enqueue_many(
        conn,
        [
            {"name": "a", "idempotency_key": "k"},
            {"name": "b", "idempotency_key": "held"},
            {"name": "c", "idempotency_key": "k"},
            {"name": "d"},
        ],
    )
    assert ids[1] == held and ids[0] == ids[2] and len(set(ids)) == 3
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (3,)


def test_enqueue_many_of_nothing(conn: psycopg.Connection[Any]) -> None:
    assert treadle.enqueue_many(conn, []) == []


def test_enqueue_many_refused_element_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(treadle.InvalidArgument) as refused:
        treadle.enqueue_many(conn, [{"name": "fine"}, {"name": "x", "max_attempts": 0}])
    assert refused.value.sqlstate == "22023"
    with pytest.raises(treadle.InvalidArgument, match="element 1") as refused:
        treadle.enqueue_many(conn, [{"name": "fine"}, ["not", "an", "object"]])  # type: ignore[list-item]
    assert refused.value.sqlstate == "22023"
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        ([{"name": "a", "run_in": "5 minutes"}], r"jobs\[0\] has 'run_in', which enqueue does not take"),
        ([{"name": "a"}, {"nam": "typo"}], r"jobs\[1\] has 'nam'"),
        ([{"name": 5}], r"jobs\[0\]\['name'\] must be a string"),
        ([{"name": "a", "priority": "high"}], r"jobs\[0\]\['priority'\] must be an integer"),
        ([{"name": "a", "max_attempts": 2**40}], r"jobs\[0\]\['max_attempts'\] must be between"),
        ([{"name": "a", "run_at": datetime(2030, 1, 1)}], r"jobs\[0\]\['run_at'\] must be an aware datetime"),
        ([{"name": "a", "run_at": "2030-01-01"}], r"jobs\[0\]\['run_at'\] must be an aware datetime"),
        ([{"name": "a", "every": 60}], r"jobs\[0\]\['every'\] must be a datetime.timedelta"),
        ([{"name": "a", "args": {"v": float("nan")}}], r"jobs\[0\]\['args'\]\['v'\] is nan"),
        ([{"name": "a"}] * 5 + [{"name": "a", "args": {"v": float("nan")}}], r"jobs\[5\]\['args'\]\['v'\] is nan"),
        ([{"name": "a", "args": [1]}, {"name": "b", "args": {1: "x"}}], r"jobs\[1\]\['args'\] has the key 1"),
        (
            [{"name": "a", "args": {"s": "a\x00"}}, {"name": "b", "meta": {"m": "b\x00"}}],
            r"jobs\[0\]\['args'\]\['s'\] contains a NUL",
        ),
        ([{"name": "a", "args": [1]}, {"name": "b", "meta": {"m": {1, 2}}}], r"jobs\[1\]\['meta'\]\['m'\] is a set"),
        ([{"name": "a", "args": Always()}], r"jobs\[0\]\['args'\] is a Always, which JSON cannot hold"),
        ([{"name": "a", "args": {"v": float("inf")}}, {"name": "b\x00"}], r"jobs\[1\]\['name'\] contains a NUL"),
        (
            [{"name": "a", "args": [float("nan")]}, {"name": "b", "unique_period": 5}],
            r"jobs\[1\]\['unique_period'\] must be a datetime.timedelta",
        ),
        ("name", "jobs must be a list of dicts, not str"),
        ({"name": "a"}, "jobs must be a list of dicts, not dict"),
        (None, "jobs must be a list of dicts, not NoneType"),
    ],
)
def test_enqueue_many_bad_arguments_send_nothing(module_dsn: str, jobs: Any, message: str) -> None:
    with psycopg.connect(module_dsn) as conn:
        with pytest.raises(treadle.InvalidArgument, match=message) as refused:
            treadle.enqueue_many(conn, jobs)
        assert refused.value.sqlstate is None
        # not even the extension check went out: no statement began a transaction
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert count_jobs(module_dsn) == 0
