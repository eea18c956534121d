"""ctx.sleep: a step ends its attempt and resumes later, holding no worker and spending no attempt.

Time is treadle's clock: each worker here connects with its own `treadle.now` (the test
moves the clock by starting the next worker at a later time), so nothing waits.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from tests.worker.worker_support import (
    enqueue,
    run,
    run_steps,
    start_workflow,
    until_run_finished,
    until_state,
    wait_for,
)
from treadle import JobContext, Worker

MakeWorker = Callable[..., Worker]
T0 = datetime(2999, 1, 1, 12, tzinfo=timezone.utc)


def at(dsn: str, when: datetime) -> str:
    """The test database's DSN for a session whose treadle clock reads `when`."""
    return make_conninfo(dsn, options=f"-c treadle.now={when.isoformat()}")


def _step(conn: psycopg.Connection[Any], run_id: int) -> dict[str, Any]:
    (step,) = run_steps(conn, run_id)
    return step


def test_a_step_sleeps_twice_and_resumes_on_treadles_clock(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker
) -> None:
    calls: list[tuple[str, int]] = []

    def nap(input: Any, ctx: JobContext) -> str:
        calls.append(("start", ctx.attempt))
        ctx.sleep(3600)
        calls.append(("after the first sleep", ctx.attempt))
        ctx.sleep(until=T0 + timedelta(hours=2, minutes=30))
        calls.append(("after the second sleep", ctx.attempt))
        return "rested"

    def worker_at(when: datetime) -> Worker:
        worker = make_worker(dsn=at(dsn, when))
        worker.workflow("napper", [("nap", nap)])
        worker.register("ping", lambda args, ctx: None)
        return worker

    run_id = start_workflow(conn, "napper", {}, ["nap"])
    first = worker_at(T0)
    first.start()
    step = wait_for(lambda: (s := _step(conn, run_id))["state"] == "available" and s["run_at"] > T0 and s, "a snooze")
    assert (step["run_at"], step["attempt"], step["last_error"]) == (T0 + timedelta(hours=1), 0, None)
    # a job enqueued after and run by the same worker: it looked again, and left the step
    until_state(conn, enqueue(conn, "ping"), "completed")
    assert _step(conn, run_id)["state"] == "available" and calls == [("start", 1)]
    recorded = run(conn, run_id)["step_sleeps"]
    assert list(recorded) == [str(step["id"])]
    assert [datetime.fromisoformat(wake) for wake in recorded[str(step["id"])]] == [T0 + timedelta(hours=1)]
    first.stop()

    # an hour on: the first sleep has ended, the second one starts
    second = worker_at(T0 + timedelta(hours=1))
    second.start()
    wait_for(lambda: _step(conn, run_id)["run_at"] > T0 + timedelta(hours=1), "the second snooze")
    step = _step(conn, run_id)
    assert (step["state"], step["run_at"], step["attempt"]) == ("available", T0 + timedelta(hours=2, minutes=30), 0)
    second.stop()

    third = worker_at(T0 + timedelta(hours=3))
    third.start()
    finished = until_run_finished(conn, run_id)
    assert (finished["state"], finished["results"]) == ("completed", {"nap": "rested"})
    step = _step(conn, run_id)
    assert (step["attempt"], step["errors"], step["last_error"]) == (1, [], None)
    assert calls == [
        ("start", 1),
        ("start", 1),
        ("after the first sleep", 1),
        ("start", 1),
        ("after the first sleep", 1),
        ("after the second sleep", 1),
    ]


def test_sleep_is_for_steps_and_takes_one_of_delay_or_until(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker()
    outcomes: list[str] = []

    def plain(args: Any, ctx: JobContext) -> None:
        try:
            ctx.sleep(1)
        except Exception as error:
            outcomes.append(str(error))

    def step(input: Any, ctx: JobContext) -> None:
        bad: list[Callable[[], None]] = [
            lambda: ctx.sleep(),
            lambda: ctx.sleep(1, until=T0),
            lambda: ctx.sleep(-1),
            lambda: ctx.sleep(timedelta(days=367)),
            lambda: ctx.sleep(until=datetime(2999, 1, 1)),  # no time zone: refused
        ]
        for call in bad:
            try:
                call()
            except Exception as error:
                outcomes.append(str(error))

    worker.register("plain", plain)
    worker.workflow("bad_sleeps", [("step", step)])
    job_id = enqueue(conn, "plain")
    run_id = start_workflow(conn, "bad_sleeps", {}, ["step"])
    worker.start()
    until_state(conn, job_id, "completed")
    until_run_finished(conn, run_id)
    assert outcomes[0].startswith("ctx.sleep is for workflow steps")
    assert sorted(outcomes[1:]) == sorted(
        [
            "ctx.sleep takes a delay or until=, one of them",
            "ctx.sleep takes a delay or until=, one of them",
            "delay must be at least 0, got -1",
            "delay must be at most 366 days, got 367 days, 0:00:00",
            "until must be a timezone-aware datetime, not datetime.datetime(2999, 1, 1, 0, 0)",
        ]
    )
    # nothing was recorded for the refused calls
    assert run(conn, run_id)["step_sleeps"] is None
