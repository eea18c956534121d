"""Attacks on quick handlers run on the completer's thread (Executor.run_in_turn): a slow, a blocking,
a raising or a re-entrant handler there keeps every other guarantee of a handler thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.worker.worker_support import PATIENCE, wait_for
from treadle import JobContext, Worker

MakeWorker = Callable[..., Worker]

QUICK = 200
SLOW_AT = 60  # the slow job, among the quick ones in claim order


def count(conn: psycopg.Connection[Any], state: str) -> int:
    row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = %s", [state]).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_ticks(conn: psycopg.Connection[Any], slow_at: tuple[int, ...], total: int) -> None:
    jobs = [{"name": "tick", "args": {"i": i, "slow": i in slow_at}} for i in range(total)]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])


def test_a_slow_handler_on_the_completers_thread_leaves_the_free_slots_claiming(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """With two slots and no jobs held ahead, a slow handler that ran on the completer's
    thread holds one slot: the other keeps claiming and running the quick jobs waiting
    (the handed-off writer's write, still running the slow handler, is no success on its way)."""
    worker = make_worker(concurrency=2, claim_ahead=0, stop_timeout=0)
    release = threading.Event()
    slow_threads: list[str] = []

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        if args["slow"]:
            slow_threads.append(threading.current_thread().name)
            release.wait(PATIENCE)

    enqueue_ticks(conn, (SLOW_AT,), QUICK + 1)
    worker.start()
    try:
        wait_for(lambda: count(conn, "completed") == QUICK, "the quick jobs to complete while the slow one runs", 20)
        assert slow_threads and slow_threads[0].startswith("treadle-completer"), slow_threads
    finally:
        release.set()
    wait_for(lambda: count(conn, "completed") == QUICK + 1, "the slow job to complete once released")


def test_a_blocking_handler_on_the_completers_thread_keeps_its_lease_and_hears_its_cancel(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """A handler that blocks on the completer's thread is heartbeaten past its lease (no rescue
    takes it while it runs) and its ctx.cancelled is set within a second of a cancel."""
    worker = make_worker(concurrency=4, stop_timeout=0)
    started = threading.Event()
    seen: dict[str, Any] = {}

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        if args["slow"]:
            seen["thread"] = threading.current_thread().name
            seen["job"] = ctx.job.id
            started.set()
            seen["cancelled"] = ctx.cancelled.wait(PATIENCE)
            seen["heard"] = time.monotonic()
            ctx.check_cancelled()

    enqueue_ticks(conn, (SLOW_AT,), QUICK + 1)
    worker.start()
    assert started.wait(PATIENCE)
    wait_for(lambda: count(conn, "completed") == QUICK, "the quick jobs to complete")
    time.sleep(3.0)  # three leases: a lapse would have been rescued
    row = conn.execute("SELECT state, attempt FROM treadle.jobs WHERE id = %s", [seen["job"]]).fetchone()
    assert row == ("running", 1), row
    asked = time.monotonic()
    conn.execute("SELECT treadle.cancel(%s::bigint)", [seen["job"]])
    wait_for(lambda: "heard" in seen, "the cancel to reach the handler")
    assert seen["cancelled"] is True
    assert seen["heard"] - asked < 1.0
    assert seen["thread"].startswith("treadle-completer"), seen
    wait_for(lambda: count(conn, "cancelled") == 1, "the job to end cancelled")


def test_base_exceptions_and_reentrant_calls_on_the_completers_thread_fail_or_finish_only_their_job(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """A handler on the completer's thread that raises KeyboardInterrupt, SystemExit or a bare
    BaseException fails its job only; one that calls ctx.progress, ctx.heartbeat and
    ctx.check_cancelled there finishes; the writes go on after them all."""
    worker = make_worker(concurrency=4, stop_timeout=0)
    threads: dict[int, str] = {}
    kinds = {50: KeyboardInterrupt, 70: SystemExit, 90: BaseException}

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        i = args["i"]
        if i in kinds:
            threads[i] = threading.current_thread().name
            raise kinds[i]("boom")
        if i in (110, 130):
            threads[i] = threading.current_thread().name
            ctx.progress(0.5, "half")
            ctx.heartbeat()
            ctx.check_cancelled()

    jobs = [{"name": "tick", "args": {"i": i}, "max_attempts": 1} for i in range(QUICK)]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])
    worker.start()
    wait_for(lambda: count(conn, "completed") + count(conn, "discarded") == QUICK, "every job to end", 20)
    assert count(conn, "discarded") == len(kinds)
    assert any(name.startswith("treadle-completer") for name in threads.values()), threads
    # the worker still works after them
    jobs = [{"name": "tick", "args": {"i": 1000 + i}} for i in range(50)]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])
    wait_for(lambda: count(conn, "completed") == QUICK - len(kinds) + 50, "the later jobs to complete", 20)


def test_never_more_handlers_than_concurrency_counting_the_completers(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """Handlers on the completer's thread, handed-off writers and handler threads together never run
    more than `concurrency` handlers at once, while a few of them turn slow."""
    worker = make_worker(concurrency=3, stop_timeout=0)
    lock = threading.Lock()
    now = [0]
    most = [0]

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            if args["slow"]:
                time.sleep(0.05)
        finally:
            with lock:
                now[0] -= 1

    enqueue_ticks(conn, tuple(range(40, 400, 37)), 400)
    worker.start()
    wait_for(lambda: count(conn, "completed") == 400, "every job to complete", 30)
    assert most[0] <= 3, most


def test_a_slow_handler_on_the_completers_thread_does_not_stop_the_claims_of_failing_jobs(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """A slow handler on the completer's thread, handed off, leaves its write unfinished until it
    returns; jobs that fail after it (no success, so no write that claims along) still free their
    slots for the claim loop, which claims the jobs waiting while the slow one runs."""
    worker = make_worker(concurrency=2, claim_ahead=0, stop_timeout=0)
    release = threading.Event()
    slow_threads: list[str] = []

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        if args["slow"]:
            slow_threads.append(threading.current_thread().name)
            release.wait(PATIENCE)
        elif args["i"] > SLOW_AT:
            raise ValueError("fails")

    jobs = [{"name": "tick", "args": {"i": i, "slow": i == SLOW_AT}, "max_attempts": 1} for i in range(QUICK + 1)]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])
    worker.start()
    try:
        wait_for(
            lambda: count(conn, "discarded") == QUICK - SLOW_AT,
            "the failing jobs to be discarded while the slow one runs",
            20,
        )
        assert slow_threads and slow_threads[0].startswith("treadle-completer"), slow_threads
    finally:
        release.set()
    wait_for(lambda: count(conn, "completed") == SLOW_AT + 1, "the slow job to complete once released")


def test_a_blocking_handler_on_the_completers_thread_times_out_and_a_stop_hands_another_back(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """On the completer's thread, a handler past its timeout is told to stop (its job fails with
    JobTimeout), and a graceful stop waits `stop_timeout` for another, then hands it back
    (available again) and returns."""
    worker = make_worker(concurrency=4, stop_timeout=1.0)
    threads: dict[str, str] = {}
    told: dict[str, float] = {}

    @worker.register("tick", timeout=0.5)
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        kind = args.get("kind")
        if kind is None:
            return
        threads[kind] = threading.current_thread().name
        began = time.monotonic()
        ctx.cancelled.wait(PATIENCE)
        told[kind] = time.monotonic() - began

    @worker.register
    def hold(args: dict[str, Any], ctx: JobContext) -> None:
        tick(args, ctx)

    jobs: list[dict[str, Any]] = [{"name": "tick", "args": {"i": i}} for i in range(QUICK)]
    jobs[SLOW_AT]["args"]["kind"] = "timeout"
    jobs[SLOW_AT]["max_attempts"] = 1
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])
    worker.start()
    wait_for(lambda: count(conn, "discarded") == 1 and count(conn, "completed") == QUICK - 1, "the jobs to end")
    assert 0.4 < told["timeout"] < 1.5, told
    row = conn.execute("SELECT errors::text FROM treadle.jobs WHERE state = 'discarded'").fetchone()
    assert row is not None and "JobTimeout" in row[0], row

    jobs = [{"name": "tick", "args": {"i": i}} for i in range(QUICK)]
    jobs[SLOW_AT] = {"name": "hold", "args": {"kind": "stop"}}  # (no timeout)
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])
    wait_for(lambda: "stop" in threads and count(conn, "completed") == 2 * QUICK - 2, "the quick jobs to end")
    began = time.monotonic()
    worker.stop()
    assert time.monotonic() - began < 5.0
    assert "stop" in told
    assert count(conn, "available") == 1
    assert any(name.startswith("treadle-completer") for name in threads.values()), threads
