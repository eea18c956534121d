"""pause, resume, set_queue and explain from the client; a full queue raises QueueFull."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle
from tests.client.producer_support import SqlWorker


def settings(conn: psycopg.Connection[Any], queue: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "select paused, concurrency, rate_limit, rate_period, max_depth, retain_completed, retain_failed"
        " from treadle.queue_settings where queue = %s",
        (queue,),
    ).fetchone()


def test_pause_and_resume(conn: psycopg.Connection[Any]) -> None:
    assert treadle.pause(conn, "mail") is True
    assert treadle.pause(conn, "mail") is False
    assert settings(conn, "mail") == (True, None, None, None, None, None, None)
    job_id = treadle.enqueue(conn, "send", queue="mail")  # enqueue still works
    assert treadle.explain(conn, job_id)[0].reason == "paused"
    assert treadle.resume(conn, "mail") is True
    assert treadle.resume(conn, "mail") is False
    assert settings(conn, "mail") is None


def test_set_queue_sets_every_setting(conn: psycopg.Connection[Any]) -> None:
    treadle.set_queue(
        conn,
        "api",
        concurrency=5,
        rate_limit=100,
        rate_period=timedelta(minutes=1),
        max_depth=1000,
        retain_completed=timedelta(days=1),
        retain_failed=timedelta(days=30),
    )
    assert settings(conn, "api") == (
        False,
        5,
        100,
        timedelta(minutes=1),
        1000,
        timedelta(days=1),
        timedelta(days=30),
    )
    treadle.set_queue(conn, "api", concurrency=2)
    assert settings(conn, "api") == (False, 2, None, None, None, None, None)
    treadle.set_queue(conn, "api")
    assert settings(conn, "api") is None


def test_enqueue_past_max_depth_raises_queue_full(conn: psycopg.Connection[Any]) -> None:
    treadle.set_queue(conn, "small", max_depth=2)
    treadle.enqueue(conn, "x", queue="small")
    treadle.enqueue(conn, "x", queue="small")
    with pytest.raises(treadle.QueueFull, match="queue small is full") as raised:
        treadle.enqueue(conn, "x", queue="small")
    assert raised.value.sqlstate == "TQ001"
    assert isinstance(raised.value.__cause__, psycopg.Error)
    with pytest.raises(treadle.QueueFull):
        treadle.enqueue_many(conn, [{"name": "x", "queue": "small"}])
    row = conn.execute("select count(*) from treadle.jobs where queue = 'small'").fetchone()
    assert row == (2,)


def test_queue_full_rolls_back_only_what_the_caller_rolls_back(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        treadle.set_queue(conn, "small", max_depth=1)
        conn.commit()
        with pytest.raises(treadle.QueueFull), conn.transaction():
            treadle.enqueue(conn, "x", queue="small")
            treadle.enqueue(conn, "x", queue="small")
        row = conn.execute("select count(*) from treadle.jobs where queue = 'small'").fetchone()
        assert row == (0,)


@pytest.mark.parametrize(
    ("options", "sqlstate"),
    [
        ({"concurrency": 0}, "22023"),
        ({"concurrency": 100_001}, "22023"),
        ({"rate_limit": 5}, "22023"),
        ({"rate_period": timedelta(seconds=1)}, "22023"),
        ({"rate_limit": 5, "rate_period": timedelta(0)}, "22023"),
        ({"rate_limit": 5, "rate_period": timedelta(days=2)}, "22023"),
        ({"max_depth": -1}, "22023"),
        ({"retain_completed": timedelta(days=-1)}, "22023"),
    ],
)
def test_set_queue_refuses_bad_settings(conn: psycopg.Connection[Any], options: dict[str, Any], sqlstate: str) -> None:
    with pytest.raises(treadle.InvalidArgument) as raised:
        treadle.set_queue(conn, "q", **options)
    assert raised.value.sqlstate == sqlstate
    assert settings(conn, "q") is None


@pytest.mark.parametrize("queue", ["", " ", "a\nb", "q" * 201])
def test_queue_names_are_checked(conn: psycopg.Connection[Any], queue: str) -> None:
    for call in (treadle.pause, treadle.resume, treadle.set_queue):
        with pytest.raises(treadle.InvalidArgument) as raised:
            call(conn, queue)
        assert raised.value.sqlstate == "22023"
    assert conn.execute("select count(*) from treadle.queues").fetchone() == (0,)


def test_arguments_of_the_wrong_type_are_refused_before_sending(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(treadle.InvalidArgument, match="queue must be a string"):
        treadle.pause(conn, None)  # type: ignore[call-overload]
    with pytest.raises(treadle.InvalidArgument, match="concurrency must be an integer"):
        treadle.set_queue(conn, "q", concurrency="5")  # type: ignore[call-overload]
    with pytest.raises(treadle.InvalidArgument, match=r"rate_period must be a datetime\.timedelta"):
        treadle.set_queue(conn, "q", rate_limit=1, rate_period=5)  # type: ignore[call-overload]
    with pytest.raises(treadle.InvalidArgument, match="job_id must be an integer"):
        treadle.explain(conn, "7")  # type: ignore[call-overload]


def test_explain_through_a_job_s_life(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    later = treadle.enqueue(conn, "x", run_at=timedelta(hours=1))
    reasons = treadle.explain(conn, later)
    assert [e.reason for e in reasons] == ["not_due", "no_worker"]
    assert reasons[0].message.startswith("not due until ") and reasons[0].at is not None
    assert "no live worker serves queue default" in reasons[1].message

    job_id = treadle.enqueue(conn, "x")
    token = sql_worker.claim(job_id)
    running = treadle.explain(conn, job_id)
    assert [e.reason for e in running] == ["running", "worker"]
    assert running[0].message.startswith("running on worker test-worker since ")
    conn.execute("select treadle.complete(%s, %s)", (job_id, token))
    assert [e.reason for e in treadle.explain(conn, job_id)] == ["completed"]
    with pytest.raises(treadle.JobNotFound):
        treadle.explain(conn, 987654321)


def test_the_async_calls(dsn: str) -> None:
    async def calls() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            assert await treadle.pause(aconn, "async") is True
            job_id = await treadle.enqueue(aconn, "x", queue="async")
            assert (await treadle.explain(aconn, job_id))[0].reason == "paused"
            assert await treadle.resume(aconn, "async") is True
            await treadle.set_queue(aconn, "async", max_depth=1)
            with pytest.raises(treadle.QueueFull):
                await treadle.enqueue(aconn, "x", queue="async")

    asyncio.run(calls())
