"""Retry policies and timeouts with real workers: Discard, Snooze, per-handler and per-job
backoff and max_attempts, and timeouts (in-process workers, and worker processes whose
handlers honour or ignore the cancel)."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle
from tests.worker.worker_support import (
    PATIENCE,
    effects,
    enqueue,
    run_steps,
    start_workflow,
    until_run_finished,
    until_state,
    wait_for,
)
from treadle import Discard, InvalidArgument, Job, JobContext, JobTimeout, Snooze, Worker, WorkerEvent

MakeWorker = Callable[..., Worker]


# -- Discard: not retryable ----------------------------------------------------------------


def test_discard_ends_the_job_at_once_with_attempts_left(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    errors: list[tuple[BaseException, Job]] = []
    events: list[WorkerEvent] = []
    worker = make_worker(on_error=lambda exc, j: errors.append((exc, j)), on_event=events.append)

    @worker.register
    def charge(args: Any, ctx: JobContext) -> None:
        raise Discard("card 4242 was deleted: no retry can succeed")

    job_id = enqueue(conn, "charge", max_attempts=25)
    worker.start()
    row = until_state(conn, job_id, "discarded")
    assert (row["attempt"], row["max_attempts"]) == (1, 25)
    assert "Discard: card 4242 was deleted" in row["last_error"]
    assert [type(e).__name__ for e, _ in errors] == ["Discard"]  # on_error hears it, as any error
    failed = wait_for(lambda: [e for e in events if e.kind == "failed"], "the failed event")
    assert [(e.job_id, e.state) for e in failed] == [(job_id, "discarded")]


# -- Snooze: later, without spending an attempt ------------------------------------------------


def test_snooze_runs_the_job_again_later_without_spending_an_attempt(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    events: list[WorkerEvent] = []
    errors: list[BaseException] = []
    attempts: list[int] = []
    worker = make_worker(on_event=events.append, on_error=lambda exc, j: errors.append(exc))

    @worker.register
    def poll_export(args: Any, ctx: JobContext) -> str:
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise Snooze(timedelta(seconds=0.3))
        return "ready"

    job_id = enqueue(conn, "poll_export", max_attempts=1)  # one attempt: a spent one would discard it
    worker.start()
    row = until_state(conn, job_id, "completed")
    assert attempts == [1, 1, 1]  # each snooze gave its attempt back
    assert (row["attempt"], row["result"], row["errors"], row["last_error"]) == (1, "ready", [], None)
    assert errors == []  # a snooze is not an error
    snoozed = [e for e in events if e.kind == "snoozed"]
    assert [(e.job_id, e.state) for e in snoozed] == [(job_id, "available")] * 2
    # each run came at least the snooze's delay after the one before
    started = [e for e in events if e.kind == "started"]
    assert len(started) == 3


def test_a_snooze_waits_its_delay_in_the_database(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    events: list[WorkerEvent] = []
    worker = make_worker(on_event=events.append)

    @worker.register
    def later(args: Any, ctx: JobContext) -> None:
        raise Snooze(600)

    job_id = enqueue(conn, "later")
    worker.start()
    wait_for(lambda: any(e.kind == "snoozed" for e in events), "the snooze to be written")
    row = conn.execute(
        "SELECT state, attempt, run_at - treadle.now() AS left FROM treadle.jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert row is not None
    state, attempt, left = row
    assert (state, attempt) == ("available", 0)
    assert timedelta(seconds=590) < left <= timedelta(seconds=600)


@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, "5", None, True, timedelta(days=367)])
def test_a_bad_snooze_delay_is_refused(delay: Any) -> None:
    with pytest.raises(InvalidArgument):
        Snooze(delay)


def test_snooze_and_discard_are_exported() -> None:
    assert treadle.Snooze is Snooze and treadle.Discard is Discard and treadle.JobTimeout is JobTimeout
    assert Snooze(0).delay == timedelta(0)
    assert Snooze(timedelta(days=366)).delay == timedelta(days=366)


# -- per-handler policy ------------------------------------------------------------------------


def test_a_handlers_max_attempts_discards_before_the_jobs_own(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker(backoff=lambda attempt: 0)
    worker.register("flaky", lambda args, ctx: 1 / 0, max_attempts=2)
    job_id = enqueue(conn, "flaky", max_attempts=25)
    worker.start()
    row = until_state(conn, job_id, "discarded")
    assert (row["attempt"], row["max_attempts"]) == (2, 25)
    assert [e["attempt"] for e in row["errors"]] == [1, 2]


def test_a_jobs_own_max_attempts_still_holds_when_lower(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(backoff=lambda attempt: 0)
    worker.register("flaky", lambda args, ctx: 1 / 0, max_attempts=10)
    job_id = enqueue(conn, "flaky", max_attempts=1)
    worker.start()
    assert until_state(conn, job_id, "discarded")["attempt"] == 1


def test_a_handlers_backoff_wins_over_the_workers(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(backoff=lambda attempt: 1)

    @worker.register("fails", backoff=lambda attempt: timedelta(minutes=7 * attempt))
    def fails(args: Any, ctx: JobContext) -> None:
        raise ValueError("down")

    worker.register("other", lambda args, ctx: 1 / 0)
    job_id = enqueue(conn, "fails")
    other_id = enqueue(conn, "other")
    worker.start()
    row = until_state(conn, job_id, "retryable")
    assert row["run_at"] - row["failed_at"] == timedelta(minutes=7)  # exact: a handler's delay is not jittered
    other = until_state(conn, other_id, "retryable")
    assert other["run_at"] - other["failed_at"] == timedelta(seconds=1)  # the Worker's, for other handlers


def test_a_jobs_own_backoff_wins_over_the_handlers(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.register("fails", lambda args, ctx: 1 / 0, backoff=lambda attempt: 1)
    job_id = treadle.enqueue(conn, "fails", backoff=[timedelta(minutes=10)])
    worker.start()
    row = until_state(conn, job_id, "retryable")
    # the job's delay, with jitter: half of it to all of it
    assert timedelta(minutes=5) <= row["run_at"] - row["failed_at"] <= timedelta(minutes=10)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", "3"),
        ("max_attempts", True),
        ("max_attempts", 2**31),
        ("backoff", 5),
        ("timeout", 0),
        ("timeout", -1),
        ("timeout", math.nan),
        ("timeout", "1 minute"),
        ("timeout", timedelta(days=8)),
    ],
)
def test_a_bad_handler_policy_is_refused_at_registration(make_worker: MakeWorker, option: str, value: Any) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument):
        worker.register("x", lambda args, ctx: None, **{option: value})
    with pytest.raises(InvalidArgument):
        worker.register("y", **{option: value})(lambda args, ctx: None)
    worker.register("x", lambda args, ctx: None)  # nothing was registered by the refused calls


# -- timeouts, in the worker -------------------------------------------------------------------


def test_a_sync_handler_past_its_timeout_sees_cancelled_and_fails_with_a_timeout(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    seen: list[tuple[bool, bool]] = []
    worker = make_worker()

    @worker.register("slow", timeout=0.5)
    def slow(args: Any, ctx: JobContext) -> str:
        if not ctx.cancelled.wait(PATIENCE):
            return "never cancelled"
        seen.append((ctx.timed_out, ctx.lease_lost))
        return "finished anyway"  # not the result: the attempt timed out

    job_id = enqueue(conn, "slow", max_attempts=1)
    worker.start()
    row = until_state(conn, job_id, "discarded")
    assert seen == [(True, False)]
    assert row["result"] is None
    assert "JobTimeout: job" in row["last_error"] and "ran past its timeout of 0.5 s" in row["last_error"]


def test_an_async_handler_past_its_timeout_gets_cancelled_error(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    cancelled = threading.Event()
    worker = make_worker()

    @worker.register
    async def fetch(args: Any, ctx: JobContext) -> None:
        try:
            await asyncio.sleep(PATIENCE)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job_id = treadle.enqueue(conn, "fetch", timeout=timedelta(seconds=0.5), max_attempts=1)
    worker.start()
    row = until_state(conn, job_id, "discarded")
    assert cancelled.is_set()
    assert "JobTimeout" in row["last_error"]


def test_check_cancelled_raises_job_timeout(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(backoff=lambda attempt: 3600)

    @worker.register("loop", timeout=timedelta(milliseconds=300))
    def loop(args: Any, ctx: JobContext) -> None:
        while True:
            ctx.check_cancelled()
            ctx.cancelled.wait(0.05)

    job_id = enqueue(conn, "loop")
    worker.start()
    row = until_state(conn, job_id, "retryable")  # a timeout is a failure: retried after the backoff
    assert row["attempt"] == 1
    assert "JobTimeout: job" in row["last_error"]
    assert row["run_at"] - row["failed_at"] == timedelta(hours=1)


def test_a_job_within_its_timeout_completes(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.register("quick", lambda args, ctx: "done", timeout=30)
    job_id = treadle.enqueue(conn, "quick", timeout=timedelta(seconds=30))
    worker.start()
    assert until_state(conn, job_id, "completed")["result"] == "done"


def test_a_jobs_own_timeout_and_backoff_hold_when_a_success_write_claims_it(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """The worker's usual claim, made by the statement that finishes its successes
    (complete_and_claim), hands the handler the job's own timeout and backoff too."""
    worker = make_worker(concurrency=1, claim_ahead=0, backoff=lambda attempt: 60)
    worker.register("quick", lambda args, ctx: None)

    @worker.register
    def slow(args: Any, ctx: JobContext) -> None:
        ctx.cancelled.wait(PATIENCE)

    # the claim loop takes the first job; with every slot full it leaves the next claims
    # to the writes of successes, so the slow job comes with the last quick one's
    quick = [enqueue(conn, "quick") for _ in range(3)]
    slow_id = treadle.enqueue(
        conn, "slow", timeout=timedelta(seconds=0.5), backoff=[timedelta(hours=2)], max_attempts=2
    )
    worker.start()
    row = until_state(conn, slow_id, "retryable")
    assert "JobTimeout" in row["last_error"] and "timeout of 0.5 s" in row["last_error"]
    assert row["run_at"] - row["failed_at"] >= timedelta(hours=1), "the job's own backoff, not the worker's 60 s"
    assert all(until_state(conn, job_id, "completed") for job_id in quick)


# -- timeouts, with worker processes -----------------------------------------------------------


def test_a_worker_process_cancels_a_job_past_its_timeout(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    job_id = treadle.enqueue(conn, "record", {"seconds": 3600}, timeout=timedelta(seconds=1), max_attempts=1)
    spawn("timekeeper")
    row = until_state(conn, job_id, "discarded")
    assert "JobTimeout" in row["last_error"] and "timeout of 1 s" in row["last_error"]
    assert [e["what"] for e in effects(conn, job_id=job_id)] == ["ran", "aborted"]


def test_a_hung_handler_that_keeps_heartbeating_is_not_kept(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    """The handler ignores the cancel and never returns; its worker process lives on.

    The job's own timeout: rescue takes it back 5 s past the timeout, whatever the
    heartbeats, and a second worker process runs it again."""
    conn = effects_conn
    job_id = treadle.enqueue(conn, "hang", {"seconds": 3600}, timeout=timedelta(seconds=1), max_attempts=2)
    stuck = spawn("stuck", concurrency=1, lease=30, heartbeat=0.2)  # heartbeats alone would hold it 30 s at a time
    wait_for(lambda: effects(conn, job_id=job_id, attempt=1), "attempt 1 to start")
    spawn("second", lease=30, heartbeat=0.2)
    row = until_state(conn, job_id, "discarded")
    assert row["attempt"] == 2
    assert [e["attempt"] for e in row["errors"]] == [1, 2]
    assert all("timed out" in e["error"] for e in row["errors"])
    assert not stuck.stopped()  # the worker process is alive: the job was taken from it


def test_a_handler_timeout_stops_the_heartbeats_of_a_hung_handler(
    effects_conn: psycopg.Connection[Any], spawn: Any
) -> None:
    """The handler's own timeout (the database does not know it): the worker stops
    heartbeating the job, so its lease lapses and a rescue returns it."""
    conn = effects_conn
    job_id = enqueue(conn, "hang", {"seconds": 3600}, max_attempts=1)
    stuck = spawn("stuck", concurrency=1, lease=2, heartbeat=0.2, hang_timeout=1)
    row = until_state(conn, job_id, "discarded")
    assert "lease expired: worker stuck stopped heartbeating" in row["last_error"]
    assert not stuck.stopped()


# -- workflow steps ----------------------------------------------------------------------------


def test_a_workflows_policy_holds_for_its_steps(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()

    def charge(input: Any, ctx: JobContext) -> None:
        raise ConnectionError("payment provider down")

    worker.workflow(
        "checkout", [("reserve", lambda i, ctx: "held"), ("charge", charge)], max_attempts=2, backoff=lambda a: 0
    )
    run_id = start_workflow(conn, "checkout", {"order": 1}, ["reserve", "charge"])  # max_attempts 25
    worker.start()
    assert until_run_finished(conn, run_id)["state"] == "failed"
    steps = {s["step"]: s for s in run_steps(conn, run_id)}
    assert (steps["reserve"]["state"], steps["charge"]["state"], steps["charge"]["attempt"]) == (
        "completed",
        "discarded",
        2,
    )


def test_a_step_that_raises_discard_fails_its_run_at_once(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker()

    def validate(input: Any, ctx: JobContext) -> None:
        raise Discard("order 1 has no items")

    worker.workflow("ship", [("validate", validate), ("send", lambda i, ctx: None)])
    run_id = start_workflow(conn, "ship", {"order": 1}, ["validate", "send"])
    worker.start()
    assert until_run_finished(conn, run_id)["state"] == "failed"
    (validate_step,) = run_steps(conn, run_id)  # the next step was never enqueued
    assert (validate_step["step"], validate_step["state"], validate_step["attempt"]) == ("validate", "discarded", 1)
