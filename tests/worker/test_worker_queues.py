"""The worker against paused and limited queues: it does not claim in a hot loop while a
paused queue's NOTIFYs keep coming, it runs nothing from it until it is resumed, and
workers together keep to a concurrency limit while they drain the queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tests.worker.worker_support import PATIENCE, enqueue, wait_for
from treadle import Worker


def claim_calls(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "select coalesce(sum(calls), 0) from pg_stat_user_functions where schemaname = 'treadle' and funcname = 'claim'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_does_not_spin_on_a_paused_queue_and_runs_it_once_resumed(
    conn: psycopg.Connection[Any], make_worker: Callable[..., Worker]
) -> None:
    # count every claim the worker's sessions make (pg_stat_user_functions; flushed when they end)
    conn.execute(f"alter database {conn.info.dbname} set track_functions = 'pl'")
    conn.execute("select treadle.pause('held')")
    ran: list[int] = []
    paused_worker = make_worker(queues=["held"], poll_interval=0.2)
    paused_worker.register("work")(lambda args, ctx: ran.append(ctx.job_id))
    paused_worker.start()

    # two seconds of NOTIFYs: a job enqueued every 10 ms, each one a wake-up
    until = time.monotonic() + 2.0
    enqueued = 0
    while time.monotonic() < until:
        enqueue(conn, "work", queue="held")
        enqueued += 1
        time.sleep(0.01)
    paused_worker.stop()

    assert ran == [], "a job of a paused queue ran"
    calls = wait_for(lambda: claim_calls(conn), "the stopped worker's statistics")
    time.sleep(0.5)  # every session of the pool has ended and reported by now
    calls = claim_calls(conn)
    assert calls < 60, f"{calls} claims for {enqueued} wake-ups in 2 s: the worker spun on the paused queue"

    conn.execute("select treadle.resume('held')")
    worker = make_worker(queues=["held"])
    worker.register("work")(lambda args, ctx: ran.append(ctx.job_id))
    worker.start()
    wait_for(lambda: len(ran) == enqueued, "the resumed queue's jobs to run")
    # a handler's return is written by the completer a moment later, in a batch
    completed = "select count(*) from treadle.jobs where queue = 'held' and state = 'completed'"
    wait_for(lambda: conn.execute(completed).fetchone() == (enqueued,), "the resumed queue's jobs to complete")
    assert sorted(ran) == sorted(set(ran)), "each job ran once"


def test_workers_keep_to_a_concurrency_limit_and_drain_the_queue(
    conn: psycopg.Connection[Any], make_worker: Callable[..., Worker]
) -> None:
    conn.execute("select treadle.set_queue('limited', concurrency => 2)")
    for _ in range(30):
        enqueue(conn, "slow", queue="limited")
    lock = threading.Lock()
    now_running = 0
    most_running = 0

    def slow(args: Any, ctx: Any) -> None:
        nonlocal now_running, most_running
        with lock:
            now_running += 1
            most_running = max(most_running, now_running)
        time.sleep(0.03)
        with lock:
            now_running -= 1

    workers = [make_worker(queues=["limited"], concurrency=4) for _ in range(3)]
    for worker in workers:
        worker.register("slow")(slow)
        worker.start()

    def completed() -> int:
        row = conn.execute(
            "select count(*) from treadle.jobs where queue = 'limited' and state = 'completed'"
        ).fetchone()
        assert row is not None
        return int(row[0])

    wait_for(lambda: completed() == 30, "the limited queue to drain", timeout=PATIENCE)
    assert most_running <= 2, f"{most_running} handlers ran at once under a concurrency limit of 2"
    assert most_running == 2, "the queue never ran at its limit"


def test_explain_says_no_live_worker_handles_a_name_the_workers_lack(
    conn: psycopg.Connection[Any], make_worker: Callable[..., Worker]
) -> None:
    worker = make_worker(queues=["default"])
    worker.register("known")(lambda args, ctx: None)
    worker.start()  # it reports itself, with the names it handles, before it claims
    job_id = enqueue(conn, "unknown")
    reasons = dict(conn.execute("select reason, message from treadle.explain(%s)", (job_id,)).fetchall())
    assert reasons["no_worker"] == (
        "no live worker handles unknown on queue default: the 1 live worker(s) serving it handle other job names"
    )
    assert "ready" not in reasons
