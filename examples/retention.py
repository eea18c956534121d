"""Retention: the workers delete finished jobs once they are past their retention.

Every worker's housekeeping calls treadle.apply_retention every `retention_interval`
seconds (60 by default): one short transaction that deletes at most `retention_batch`
finished jobs past their retention, and again at once while a batch comes back full.
Workers at once skip each other's rows, so no leader is needed. Until the owner
configures otherwise, completed jobs are kept 7 days and failed ones 30 days
(docs/retention.md), so the jobs this script finishes stay: it shows them kept, and the
catch-up loop an operator runs by hand after turning retention on over a large backlog.

    DATABASE_URL=postgresql://localhost/app python examples/retention.py
"""

from __future__ import annotations

import os
import uuid

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "thumbnails"
BATCH = 1000


def catch_up(conn: psycopg.Connection) -> int:
    """Delete everything past its retention, one batch per transaction; how many jobs went."""
    deleted = 0
    while True:
        (got,) = conn.execute("select treadle.apply_retention(batch => %s)", [BATCH]).fetchone()
        deleted += got
        if got < BATCH:  # less than a batch: caught up
            return deleted


def main() -> None:
    tag = uuid.uuid4().hex  # this run's jobs
    worker = treadle.Worker(DSN, queues=[QUEUE], poll_interval=0.2, retention_interval=1, retention_batch=500)

    @worker.register("thumbnail")
    def thumbnail(args: dict, ctx: treadle.JobContext) -> dict:
        return {"width": 100 * args["n"]}

    with psycopg.connect(DSN) as conn:
        ids = treadle.enqueue_many(
            conn, [{"name": "thumbnail", "args": {"n": n, "tag": tag}, "queue": QUEUE} for n in range(1, 21)]
        )
    with worker:
        results = [treadle.wait(DSN, job_id, timeout=60) for job_id in ids]
    print(f"{len(results)} thumbnails made, widths {results[0]['width']}..{results[-1]['width']}")

    with psycopg.connect(DSN, autocommit=True) as conn:
        deleted = catch_up(conn)
        (kept,) = conn.execute(
            "select count(*) from treadle.jobs where id = any(%s) and state = 'completed'", [ids]
        ).fetchone()
    print(f"catch-up deleted {deleted} jobs past their retention; this run's {kept} jobs are kept")
    assert kept == len(ids), "jobs completed seconds ago are within their retention"


if __name__ == "__main__":
    main()
