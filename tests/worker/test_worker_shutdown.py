"""Stopping: running handlers get stop_timeout to finish, the rest is handed back with release."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from tests.worker.worker_support import PATIENCE, effects, enqueue, job, wait_for
from treadle import JobContext, Worker, WorkerEvent

MakeWorker = Callable[..., Worker]


def test_a_stop_lets_handlers_finish_then_hands_back_the_rest(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    events: list[WorkerEvent] = []
    worker = make_worker(stop_timeout=2.0, concurrency=2, on_event=events.append)
    started = {"quick": threading.Event(), "stubborn": threading.Event()}
    quick_may_finish = threading.Event()
    seen: dict[str, bool] = {}

    @worker.register
    def quick(args: Any, ctx: JobContext) -> str:
        started["quick"].set()
        quick_may_finish.wait(PATIENCE)
        return "finished in time"

    @worker.register
    def stubborn(args: Any, ctx: JobContext) -> str:
        started["stubborn"].set()
        seen["cancelled"] = ctx.cancelled.wait(PATIENCE)
        return "too late to count"

    quick_id, stubborn_id = enqueue(conn, "quick"), enqueue(conn, "stubborn")
    worker.start()
    assert all(event.wait(PATIENCE) for event in started.values())
    worker.stop(wait=False)
    late_id = enqueue(conn, "quick")  # arrives after the stop: never claimed
    quick_may_finish.set()
    worker.stop()

    assert job(conn, quick_id)["result"] == "finished in time"
    handed_back = job(conn, stubborn_id)
    # the job keeps the token that released it (a repeated release answers the same), but no lease
    assert (handed_back["state"], handed_back["attempt"], handed_back["lease_until"], handed_back["result"]) == (
        "available",
        0,
        None,
        None,
    )
    assert (job(conn, late_id)["state"], job(conn, late_id)["attempt"]) == ("available", 0)
    assert [(e.job_id, e.state) for e in events if e.kind == "released"] == [(stubborn_id, "available")]
    wait_for(lambda: "cancelled" in seen, "the stubborn handler to return")
    assert seen["cancelled"]
    assert conn.execute("SELECT count(*) FROM treadle.workers").fetchone() == (0,)


def test_an_immediate_stop_does_not_wait_for_handlers(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(stop_timeout=3600)
    started = threading.Event()
    gate = threading.Event()

    @worker.register
    def blocked(args: Any, ctx: JobContext) -> bool:
        started.set()
        return gate.wait(PATIENCE)

    job_id = enqueue(conn, "blocked")
    worker.start()
    assert started.wait(PATIENCE)

    stopper = threading.Thread(target=worker.stop, kwargs={"immediate": True})
    stopper.start()
    stopper.join(PATIENCE)
    assert not stopper.is_alive(), "stop(immediate=True) waited for a handler with an hour's stop_timeout"
    assert (job(conn, job_id)["state"], job(conn, job_id)["attempt"]) == ("available", 0)
    gate.set()


def test_sigterm_lets_the_running_job_finish(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    job_id = enqueue(conn, "record", {"seconds": 1})
    child = spawn("graceful", stop_timeout=60)
    wait_for(lambda: effects(conn, "ran", job_id=job_id), "the handler to start")
    child.signal(signal.SIGTERM)
    assert child.wait_exit() == 0, child.log()
    assert job(conn, job_id)["result"] == {"by": "graceful", "attempt": 1}
    assert "stopping (signal SIGTERM)" in child.log()
    assert "worker graceful exited cleanly" in child.log()


def test_a_second_sigterm_hands_back_at_once(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    job_id = enqueue(conn, "record", {"seconds": 3600})
    child = spawn("impatient", stop_timeout=3600)
    wait_for(lambda: effects(conn, "ran", job_id=job_id), "the handler to start")
    child.signal(signal.SIGTERM)
    wait_for(lambda: "stopping (signal SIGTERM)" in child.log(), "the first signal to be heard")
    child.signal(signal.SIGTERM)
    assert child.wait_exit() == 0, child.log()
    # the worker is gone: what it handed back is written by now, or never
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["lease_until"]) == ("available", 0, None), child.log()
    assert [e["worker"] for e in effects(conn, "released", job_id=job_id)] == ["impatient"]
