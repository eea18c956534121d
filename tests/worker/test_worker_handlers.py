"""The worker runs handlers against a real database: results, failures, retries, events."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from tests.worker.worker_support import PATIENCE, enqueue, job, until_state, wait_for
from treadle import ExtensionMissing, Job, JobContext, Worker, WorkerEvent

MakeWorker = Callable[..., Worker]


def test_a_sync_handler_result_is_stored(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    seen: list[tuple[Any, int, str, str]] = []

    @worker.handler("add")
    def add(args: dict[str, int], ctx: JobContext) -> dict[str, int]:
        seen.append((ctx.job_id, ctx.attempt, ctx.queue, ctx.worker_id))
        return {"sum": args["a"] + args["b"]}

    job_id = enqueue(conn, "add", {"a": 2, "b": 3})
    worker.start()
    row = until_state(conn, job_id, "completed")
    assert row["result"] == {"sum": 5}
    assert row["worker_id"] == worker.worker_id
    assert seen == [(job_id, 1, "default", worker.worker_id)]


def test_an_async_handler_runs_on_the_event_loop(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()

    @worker.register
    async def fetch(args: dict[str, str], ctx: JobContext) -> list[str]:
        await asyncio.sleep(0.01)
        return [args["url"], "ok"]

    job_id = enqueue(conn, "fetch", {"url": "https://example.org"})
    worker.start()
    assert until_state(conn, job_id, "completed")["result"] == ["https://example.org", "ok"]


def test_async_handlers_wait_together_on_the_event_loop_and_their_failures_are_recorded(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """An async def runs as a task of the worker's event loop: a claimed batch waits on
    it all at once, and what one raises is written as its failure and heard by on_error."""
    errors: list[tuple[str, int]] = []
    worker = make_worker(concurrency=6, on_error=lambda exc, j: errors.append((str(exc), j.id)))
    threads: set[str] = set()
    waiting = 0
    all_in: asyncio.Event | None = None

    @worker.register
    async def gather(args: dict[str, int], ctx: JobContext) -> int:
        nonlocal waiting, all_in
        threads.add(threading.current_thread().name)
        all_in = all_in or asyncio.Event()
        waiting += 1
        if waiting == 6:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), PATIENCE)  # only when all six wait together
        if args["n"] == 0:
            raise ValueError("number 0 fails")
        return args["n"]

    ids = [enqueue(conn, "gather", {"n": n}, max_attempts=1) for n in range(6)]
    worker.start()
    failed = until_state(conn, ids[0], "discarded")
    assert "ValueError: number 0 fails" in failed["last_error"]
    assert [until_state(conn, job_id, "completed")["result"] for job_id in ids[1:]] == [1, 2, 3, 4, 5]
    assert threads == {"treadle-asyncio"}
    assert errors == [("number 0 fails", ids[0])]


@pytest.mark.parametrize("kinds", [("async",) * 6, ("async", "sync") * 3], ids=["async", "mixed"])
def test_no_more_handlers_run_at_once_than_concurrency_async_ones_included(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, kinds: tuple[str, ...]
) -> None:
    """Async handlers hold no thread, yet count against `concurrency` as sync ones do,
    jobs claimed ahead included: two at a time here, whatever the mix."""
    worker = make_worker(concurrency=2, claim_ahead=4)
    lock = threading.Lock()
    running, most = 0, 0

    def enter() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)

    def leave() -> None:
        nonlocal running
        with lock:
            running -= 1

    @worker.register("async")
    async def async_job(args: Any, ctx: JobContext) -> None:
        enter()
        await asyncio.sleep(0.2)
        leave()

    @worker.register("sync")
    def sync_job(args: Any, ctx: JobContext) -> None:
        enter()
        time.sleep(0.2)
        leave()

    ids = [enqueue(conn, kind) for kind in kinds]
    worker.start()
    for job_id in ids:
        until_state(conn, job_id, "completed")
    assert most == 2


def test_a_stop_cancels_a_running_async_handler_and_hands_its_job_back(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker(stop_timeout=0.2)
    started, cancelled = threading.Event(), threading.Event()

    @worker.register
    async def sleepy(args: Any, ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(PATIENCE)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job_id = enqueue(conn, "sleepy")
    worker.start()
    assert started.wait(PATIENCE)
    worker.stop()
    assert cancelled.wait(PATIENCE)
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["lease_until"]) == ("available", 0, None)


def test_handlers_run_concurrently_up_to_concurrency(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(concurrency=3)
    together = threading.Barrier(3, timeout=PATIENCE)  # passes only when three run at once

    @worker.register
    def meet(args: Any, ctx: JobContext) -> int:
        return together.wait()

    ids = [enqueue(conn, "meet") for _ in range(3)]
    worker.start()
    results = sorted(until_state(conn, job_id, "completed")["result"] for job_id in ids)
    assert results == [0, 1, 2]


def test_a_result_that_is_not_json_fails_the_job(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.register("sets", lambda args, ctx: {"tags": {"a", "b"}})
    job_id = enqueue(conn, "sets", max_attempts=1)
    worker.start()
    row = until_state(conn, job_id, "discarded")
    assert row["result"] is None
    assert "the handler's result['tags'] is a set, which JSON cannot hold" in row["last_error"]


def test_failures_retry_after_the_custom_backoff(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    errors: list[tuple[BaseException, Job]] = []
    events: list[WorkerEvent] = []
    worker = make_worker(
        backoff=lambda attempt: 0.25 * attempt, on_error=lambda exc, j: errors.append((exc, j)), on_event=events.append
    )

    @worker.register
    def flaky(args: Any, ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise ValueError("the first attempt fails")
        return "second time lucky"

    job_id = enqueue(conn, "flaky")
    worker.start()
    row = until_state(conn, job_id, "completed")
    assert (row["attempt"], row["result"]) == (2, "second time lucky")
    (failure,) = row["errors"]
    assert failure["attempt"] == 1
    assert "ValueError: the first attempt fails" in failure["error"]
    assert "Traceback" in failure["error"]
    # the database scheduled the retry backoff(1) = 0.25 s after the failure
    first_failed_at = row["failed_at"]
    assert [(type(e).__name__, j.id, j.attempt) for e, j in errors] == [("ValueError", job_id, 1)]
    failed = [e for e in events if e.kind == "failed"]
    assert [(e.job_id, e.attempt, e.state, e.error) for e in failed] == [
        (job_id, 1, "retryable", "ValueError: the first attempt fails")
    ]
    assert row["started_at"] - first_failed_at >= timedelta(seconds=0.25)


def test_the_retry_delay_is_what_backoff_returns(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(backoff=lambda attempt: timedelta(minutes=attempt))
    worker.register("fails", lambda args, ctx: 1 / 0)
    job_id = enqueue(conn, "fails")
    worker.start()
    row = until_state(conn, job_id, "retryable")
    assert row["run_at"] - row["failed_at"] == timedelta(minutes=1)


def test_a_broken_backoff_falls_back_to_the_default(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    def backoff(attempt: int) -> float:
        raise RuntimeError("no delay today")

    worker = make_worker(backoff=backoff)
    worker.register("fails", lambda args, ctx: 1 / 0)
    job_id = enqueue(conn, "fails")
    with caplog.at_level(logging.ERROR, logger="treadle.worker"):
        worker.start()
        row = until_state(conn, job_id, "retryable")
    # the SQL default for attempt 1: 2 s, jittered down to no less than half of it
    assert timedelta(seconds=1) <= row["run_at"] - row["failed_at"] <= timedelta(seconds=2)
    assert "backoff(1) failed; using the default delay" in caplog.text


def test_spent_attempts_discard_the_job_with_one_log_line_each(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[WorkerEvent] = []
    worker = make_worker(backoff=lambda attempt: 0, on_event=events.append)

    @worker.register
    def doomed(args: Any, ctx: JobContext) -> None:
        raise OSError("disk full")

    job_id = enqueue(conn, "doomed", max_attempts=2)
    with caplog.at_level(logging.WARNING, logger="treadle.worker"):
        worker.start()
        row = until_state(conn, job_id, "discarded")
        # the worker fires the event (and logs) once fail() has answered: just after the commit
        wait_for(lambda: sum(e.kind == "failed" for e in events) == 2, "the second failed event")
    assert row["attempt"] == 2
    assert [e["attempt"] for e in row["errors"]] == [1, 2]
    # each attempt's event and line come just after its commit, on the thread that ran it: with a
    # backoff of 0 the second attempt can run and fail on another thread before the first one's
    # thread gets to them, so they are compared in attempt order
    failed = sorted((e.attempt, e.state) for e in events if e.kind == "failed")
    assert failed == [(1, "retryable"), (2, "discarded")]
    lines = sorted(r.getMessage() for r in caplog.records if getattr(r, "job_id", None) == job_id)
    fields = f"job_id={job_id} job_name=doomed queue=default attempt={{}} max_attempts=2 state={{}}"
    tail = f'error_type=OSError error="disk full" worker_id={worker.worker_id}'
    assert lines == [
        f"job failed {fields.format(1, 'retryable')} {tail}",
        f"job failed {fields.format(2, 'discarded')} {tail}",
    ]


def test_events_follow_a_job_and_a_failing_callback_is_only_logged(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    kinds: list[tuple[str, int]] = []

    def on_event(event: WorkerEvent) -> None:
        kinds.append((event.kind, event.job_id))
        raise RuntimeError("a broken callback")

    worker = make_worker(on_event=on_event)
    worker.register("noop", lambda args, ctx: None)
    job_id = enqueue(conn, "noop")
    with caplog.at_level(logging.ERROR, logger="treadle.worker"):
        worker.start()
        until_state(conn, job_id, "completed")
        wait_for(lambda: ("completed", job_id) in kinds, "the completed event")
    assert kinds == [("claimed", job_id), ("started", job_id), ("completing", job_id), ("completed", job_id)]
    assert f"on_event raised for claimed of job {job_id}" in caplog.text


def test_only_registered_names_are_claimed(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(queues=["mail", "default"])
    worker.register("mine", lambda args, ctx: ctx.queue)
    theirs = enqueue(conn, "theirs")
    mine = enqueue(conn, "mine", queue="mail")
    elsewhere = enqueue(conn, "mine", queue="reports")
    worker.start()
    assert until_state(conn, mine, "completed")["result"] == "mail"
    worker.stop()
    assert job(conn, theirs)["state"] == "available"
    assert job(conn, elsewhere)["state"] == "available"


def test_notify_wakes_the_worker_long_before_its_poll(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    # The first claim happens at start; after that only NOTIFY can wake a worker that
    # polls every hour, so the job completing at all shows the wake-up worked.
    worker = make_worker(poll_interval=3600)
    worker.register("ping", lambda args, ctx: "pong")
    worker.start()
    job_id = enqueue(conn, "ping")
    assert until_state(conn, job_id, "completed")["result"] == "pong"


def test_periodic_jobs_go_on_through_the_sql(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.register("tick", lambda args, ctx: ctx.job_id)
    first = enqueue(conn, "tick", every=timedelta(milliseconds=200))
    worker.start()
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) >= 3 FROM treadle.jobs WHERE name = 'tick' AND state = 'completed'"
            ).fetchone()
            == (True,)
        ),
        "three occurrences",
    )
    worker.stop()
    rows = conn.execute(
        "SELECT id, next_id, result, state FROM treadle.jobs WHERE name = 'tick' ORDER BY id"
    ).fetchall()
    assert rows[0][0] == first
    for (job_id, next_id, result, state), following in itertools.pairwise(rows):
        assert next_id == following[0], "each occurrence started the next one"
        assert (state, result) == ("completed", job_id)


def test_progress_is_stored_while_the_job_runs(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    go_on = threading.Event()
    refused: list[str] = []

    @worker.register
    def upload(args: Any, ctx: JobContext) -> str:
        assert ctx.progress(0.5, "half way")
        for bad in (1.5, -0.1, float("nan"), "half", True):
            try:
                ctx.progress(bad)  # type: ignore[arg-type]  # wrong on purpose
            except ValueError as error:
                refused.append(str(error))
        try:
            ctx.progress(0.6, "a NUL \x00 here")
        except ValueError as error:
            refused.append(str(error))
        go_on.wait(PATIENCE)
        return "uploaded"

    job_id = enqueue(conn, "upload")
    worker.start()
    row = wait_for(lambda: (r := job(conn, job_id))["progress"] is not None and r, "progress")
    assert (row["state"], row["progress"], row["progress_message"]) == ("running", 0.5, "half way")
    go_on.set()
    until_state(conn, job_id, "completed")
    assert len(refused) == 6
    assert job(conn, job_id)["progress"] == 0.5, "refused progress changed nothing"
    assert "fraction must be between 0 and 1, got 1.5" in refused[0]
    assert "fraction must be a number between 0 and 1, not str" in refused[3]
    assert "message contains a NUL character" in refused[5]


def test_a_worker_runs_on_the_applications_pool(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker
) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=6, open=True) as pool:  # autocommit off, like most apps
        worker = make_worker(dsn=pool)
        worker.register("echo", lambda args, ctx: args)
        job_id = enqueue(conn, "echo", {"x": 1})
        worker.start()
        assert until_state(conn, job_id, "completed")["result"] == {"x": 1}
        worker.stop()
        assert not pool.closed, "the application's pool stays open"
        with pool.connection() as pooled:
            assert pooled.execute("SELECT 1").fetchone() == (1,)


def test_the_worker_reports_itself_while_it_runs(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(queues=["a", "b"], concurrency=3)
    worker.register("noop", lambda args, ctx: None)
    worker.start()
    row = conn.execute("SELECT queues, concurrency FROM treadle.workers WHERE id = %s", [worker.worker_id]).fetchone()
    assert row == (["a", "b"], 3)
    worker.stop()
    assert conn.execute("SELECT count(*) FROM treadle.workers").fetchone() == (0,)


def test_a_database_without_the_extension_stops_the_start(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    conn.execute("DROP EXTENSION treadle")
    worker = make_worker()
    worker.register("noop", lambda args, ctx: None)
    with pytest.raises(ExtensionMissing, match="run CREATE EXTENSION treadle"):
        worker.start()
