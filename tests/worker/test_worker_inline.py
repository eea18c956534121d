"""Quick handlers run on the completer's thread (Executor.run_in_turn); a slow one among them holds nothing up."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.worker.worker_support import PATIENCE, wait_for
from treadle import JobContext, Worker

MakeWorker = Callable[..., Worker]

QUICK = 300
SLOW_AT = (100, 150, 200)  # among the quick jobs, in claim order


def completed(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'completed'").fetchone()
    assert row is not None
    return int(row[0])


def test_a_slow_handler_among_quick_ones_holds_neither_the_jobs_behind_it_nor_their_writes(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """Once handlers are quick, the jobs a write claims run on the completer's thread, one after
    another. A job there that turns out slow hands the jobs queued behind it to handler threads,
    and another thread takes over the writes: every quick job completes while the slow ones wait."""
    worker = make_worker(concurrency=8, stop_timeout=0)
    release = threading.Event()
    slow_threads: list[str] = []

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        if args["slow"]:
            slow_threads.append(threading.current_thread().name)
            assert release.wait(PATIENCE)

    jobs = [{"name": "tick", "args": {"i": i, "slow": i in SLOW_AT}} for i in range(QUICK + len(SLOW_AT))]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])
    worker.start()
    try:
        wait_for(lambda: completed(conn) == QUICK, f"the {QUICK} quick jobs to complete while the slow ones run")
        assert len(slow_threads) == len(SLOW_AT)
        # the case this is about: at least one slow job was run by the completer's thread itself
        assert any(name.startswith("treadle-completer") for name in slow_threads), slow_threads
        row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'running'").fetchone()
        assert row is not None and row[0] == len(SLOW_AT)
    finally:
        release.set()
    wait_for(lambda: completed(conn) == len(jobs), "the slow jobs to complete once released")
