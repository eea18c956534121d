"""The worker's cycle: successes finished with complete_and_claim, jobs claimed ahead of free slots.

Jobs held ahead wait for a handler thread under their own lease; a stop hands them
back at once, unstarted, with their attempt given back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.worker.worker_support import PATIENCE, enqueue, job, until_state, wait_for
from treadle import InvalidArgument, JobContext, Worker, WorkerEvent

MakeWorker = Callable[..., Worker]


def running_by(conn: psycopg.Connection[Any], worker: Worker) -> int:
    row = conn.execute(
        "SELECT count(*) FROM treadle.jobs WHERE state = 'running' AND worker_id = %s", [worker.worker_id]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_jobs_claimed_ahead_wait_for_a_thread_and_a_stop_hands_them_back_unstarted(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    events: list[WorkerEvent] = []
    worker = make_worker(concurrency=1, claim_ahead=2, on_event=events.append, stop_timeout=PATIENCE)
    started: list[int] = []
    may_finish = threading.Event()

    @worker.register
    def slow(args: Any, ctx: JobContext) -> str:
        started.append(ctx.job_id)
        may_finish.wait(PATIENCE)
        return "done"

    ids = [enqueue(conn, "slow") for _ in range(4)]
    worker.start()
    wait_for(lambda: started, "the first handler to start")
    wait_for(lambda: running_by(conn, worker) == 3, "one running job and two claimed ahead")
    assert len(started) == 1 and worker.busy_handlers == 1 and worker.running_jobs == 3
    worker.stop(wait=False)
    # the two held ahead go back at once, while the one running may still finish
    waiting = [job_id for job_id in ids[:3] if job_id != started[0]]
    for job_id in waiting:
        row = until_state(conn, job_id, "available")
        assert (row["attempt"], row["lease_until"]) == (0, None)
    may_finish.set()
    worker.stop()
    assert job(conn, started[0])["result"] == "done"
    assert started == [started[0]], "a job handed back unstarted never ran"
    assert job(conn, ids[3])["state"] == "available" and job(conn, ids[3])["attempt"] == 0
    released = sorted(e.job_id for e in events if e.kind == "released")
    assert released == sorted(waiting)
    assert not [e for e in events if e.kind == "started" and e.job_id in waiting]


def test_claim_ahead_0_holds_no_more_than_concurrency(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(concurrency=2, claim_ahead=0)
    release = threading.Event()
    running = threading.Semaphore(0)

    @worker.register
    def slow(args: Any, ctx: JobContext) -> None:
        running.release()
        release.wait(PATIENCE)

    ids = [enqueue(conn, "slow") for _ in range(5)]
    worker.start()
    assert running.acquire(timeout=PATIENCE) and running.acquire(timeout=PATIENCE)
    assert running_by(conn, worker) == 2
    release.set()
    for job_id in ids:
        until_state(conn, job_id, "completed")


def holding(worker: Worker) -> int:
    """The jobs the worker holds a slot for (claimed, its handler not returned): what its claims
    keep within concurrency + claim_ahead. (`running_jobs` counts too the jobs whose handler
    returned and whose success a write has not ended yet, as a write claims more.)"""
    with worker._lock:
        return sum(1 for run in worker._active if run.holds_slot)


@pytest.mark.parametrize(("handler_seconds", "most"), [(0.0, 2 + 3 * 2), (0.005, 2 + 2)])
def test_a_worker_left_to_choose_holds_three_times_its_claim_ahead_while_handlers_take_under_a_millisecond(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, handler_seconds: float, most: int
) -> None:
    worker = make_worker(concurrency=2)
    held: list[int] = []

    @worker.register
    def tick(args: Any, ctx: JobContext) -> None:
        held.append(holding(worker))
        if handler_seconds:
            threading.Event().wait(handler_seconds)

    with conn.transaction():
        ids = [enqueue(conn, "tick") for _ in range(300 if not handler_seconds else 60)]
    worker.start()
    for job_id in ids:
        until_state(conn, job_id, "completed")
    assert max(held) <= most, held
    if not handler_seconds:
        assert max(held) > 2 + 2, "quick handlers: more than concurrency + claim_ahead held at some time"


def test_a_backlog_drains_through_complete_and_claim(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(concurrency=3)
    worker.register("quick", lambda args, ctx: args["i"] * 2)
    with conn.transaction():
        ids = [enqueue(conn, "quick", {"i": i}) for i in range(60)]
    worker.start()
    rows = [until_state(conn, job_id, "completed") for job_id in ids]
    assert [row["result"] for row in rows] == [i * 2 for i in range(60)]
    assert {row["attempt"] for row in rows} == {1}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "claim_ahead must be"),
        (1001, "claim_ahead must be"),
        ("2", "claim_ahead must be"),
        (1.5, "claim_ahead must be"),
        (True, "claim_ahead must be"),
    ],
)
def test_claim_ahead_is_checked(dsn: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Worker(dsn, claim_ahead=value)
