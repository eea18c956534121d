"""A worker that just finished jobs claims again at once: the next job of a chain never waits a poll.

Each job of a chain enqueues the next one to the same queue (or, in a workflow, its
finish writes the next step). The worker's next write of successes claims it in the
same statement; a job settled without such a write (complete_in, a failure) has the
claim loop claim at once. So a chain of HOPS jobs finishes in well under one
poll interval, with LISTEN and without it: no NOTIFY is needed to find work that
this worker's own jobs made. (The bound is a behaviour, not a speed: a single wait
for the poll would take the whole of it.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import treadle
from tests.worker.worker_support import enqueue, start_workflow, wait_for
from treadle import JobContext, Worker

MakeWorker = Callable[..., Worker]

HOPS = 20
LONG_POLL = 30.0  # one wait for a poll takes this long: the chain must finish sooner


def completed(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE name = %s AND state = 'completed'", [name]).fetchone()
    assert row is not None
    return int(row[0])


def chain_finishes_within_a_poll(conn: psycopg.Connection[Any], worker: Worker, name: str, hops: int = HOPS) -> None:
    """Start `worker` (the first hop is enqueued already) and see `hops` jobs complete before one poll passes."""
    began = time.monotonic()
    worker.start()
    try:
        wait_for(lambda: completed(conn, name) >= hops, f"{hops} hops of {name} within one poll", timeout=LONG_POLL)
    finally:
        worker.stop()
    assert completed(conn, name) == hops
    assert time.monotonic() - began < LONG_POLL


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listen"])
def test_a_job_a_sync_handler_enqueues_is_claimed_with_the_finish(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker, listen: bool
) -> None:
    worker = make_worker(listen=listen, poll_interval=LONG_POLL)

    @worker.register
    def hop(args: Any, ctx: JobContext) -> None:
        if args["n"] < HOPS:
            with psycopg.connect(dsn, autocommit=True) as own:  # committed before the handler returns
                treadle.enqueue(own, "hop", {"n": args["n"] + 1})

    enqueue(conn, "hop", {"n": 1})
    chain_finishes_within_a_poll(conn, worker, "hop")


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listen"])
def test_a_job_an_async_handler_enqueues_is_claimed_with_the_finish(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker, listen: bool
) -> None:
    worker = make_worker(listen=listen, poll_interval=LONG_POLL)

    @worker.register
    async def ahop(args: Any, ctx: JobContext) -> None:
        if args["n"] < HOPS:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
                await treadle.enqueue(own, "ahop", {"n": args["n"] + 1})

    enqueue(conn, "ahop", {"n": 1})
    chain_finishes_within_a_poll(conn, worker, "ahop")


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listen"])
def test_a_job_enqueued_in_the_transaction_that_completes_its_parent_is_claimed_at_once(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker, listen: bool
) -> None:
    # complete_in settles the job in the handler's transaction: the worker writes nothing more for
    # it, so its claim loop, not a write of successes, claims the next hop
    worker = make_worker(listen=listen, poll_interval=LONG_POLL)

    @worker.register
    def txhop(args: Any, ctx: JobContext) -> None:
        with psycopg.connect(dsn) as own:
            if args["n"] < HOPS:
                treadle.enqueue(own, "txhop", {"n": args["n"] + 1})
            ctx.complete_in(own)

    enqueue(conn, "txhop", {"n": 1})
    chain_finishes_within_a_poll(conn, worker, "txhop")


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listen"])
def test_a_failed_attempt_due_again_at_once_runs_again_at_once(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, listen: bool
) -> None:
    worker = make_worker(listen=listen, poll_interval=LONG_POLL, backoff=lambda attempt: 0)

    @worker.register("flaky", max_attempts=HOPS)
    def flaky(args: Any, ctx: JobContext) -> None:
        if ctx.attempt < HOPS:
            raise RuntimeError(f"attempt {ctx.attempt} fails")

    job_id = enqueue(conn, "flaky", max_attempts=HOPS)
    chain_finishes_within_a_poll(conn, worker, "flaky", hops=1)
    row = conn.execute("SELECT attempt FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None and row[0] == HOPS


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listen"])
def test_a_workflows_next_step_is_claimed_with_the_finish_of_the_one_before(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, listen: bool
) -> None:
    worker = make_worker(listen=listen, poll_interval=LONG_POLL)
    steps = [f"s{i}" for i in range(HOPS)]
    worker.workflow("walk", [(step, lambda input, ctx: None) for step in steps])
    run_id = start_workflow(conn, "walk", {}, steps)
    began = time.monotonic()
    worker.start()
    try:
        wait_for(
            lambda: (
                conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone()
                == ("completed",)
            ),
            f"the {HOPS} steps within one poll",
            timeout=LONG_POLL,
        )
    finally:
        worker.stop()
    assert time.monotonic() - began < LONG_POLL
