"""What a user may do in a handler that runs on the completer's thread (Executor.run_in_turn),
and what still holds there: handlers that wait run side by side, a lease holds while a job waits
its turn, a stop and a cancel reach the jobs queued behind a slow one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.worker.worker_support import wait_for
from treadle import JobContext, Worker

MakeWorker = Callable[..., Worker]


def count(conn: psycopg.Connection[Any], state: str) -> int:
    row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = %s", [state]).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_ticks(conn: psycopg.Connection[Any], total: int, **args: Any) -> None:
    jobs = [{"name": "tick", "args": {"i": i, **args}} for i in range(total)]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])


def test_handlers_that_wait_under_a_millisecond_still_run_side_by_side(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """Handlers that spend half a millisecond waiting (on I/O: the thread holds no lock) are quick
    on average, but `concurrency` of them run at once, not one after another on the thread that
    wrote the claim: the work is done several times faster than in a single file."""
    worker = make_worker(concurrency=16, stop_timeout=0)
    spans: list[tuple[float, float]] = []

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        began = time.monotonic()
        time.sleep(0.0005)
        spans.append((began, time.monotonic()))

    total = 3000
    enqueue_ticks(conn, total)
    worker.start()
    wait_for(lambda: count(conn, "completed") == total, "every job to complete", 120)
    later = sorted(spans)[total // 3 :]  # once the average says quick
    busy = sum(end - began for began, end in later)
    span = max(end for _, end in later) - later[0][0]
    assert busy / span > 2.5, f"{busy / span:.2f} handlers ran at once on average"
