"""Queues with limits: a partner API called at most 2 at a time and 20 times a second,
a reports queue that refuses work past 5 waiting jobs and starts paused, and
treadle.explain saying why a job waits.

The limits hold across every worker process, on every machine: they live in the
database (treadle.queues), and every claim keeps to them.

    DATABASE_URL=postgresql://localhost/app python examples/queue_limits.py
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]

worker = treadle.Worker(DSN, queues=["partner-api", "reports"], concurrency=8, poll_interval=0.2)
lock = threading.Lock()
calling = 0  # partner API calls in flight in this process
most_calling = 0


@worker.register("call_partner")
def call_partner(args: Any, ctx: treadle.JobContext) -> dict[str, Any]:
    global calling, most_calling
    with lock:
        calling += 1
        most_calling = max(most_calling, calling)
    time.sleep(0.05)  # the partner's answer
    with lock:
        calling -= 1
    return {"order": args["order"], "confirmed": True}


@worker.register("build_report")
def build_report(args: Any, ctx: treadle.JobContext) -> dict[str, Any]:
    return {"report": args["n"]}


with psycopg.connect(DSN, autocommit=True) as conn:
    # at most 2 calls at once and 20 a second (bursts of up to 20), over every worker
    treadle.set_queue(conn, "partner-api", concurrency=2, rate_limit=20, rate_period=timedelta(seconds=1))
    # backpressure: at most 5 reports waiting; the queue starts paused
    treadle.set_queue(conn, "reports", max_depth=5)
    treadle.pause(conn, "reports")

    calls = [treadle.enqueue(conn, "call_partner", {"order": n}, queue="partner-api") for n in range(30)]
    reports = []
    try:
        for n in range(8):
            reports.append(treadle.enqueue(conn, "build_report", {"n": n}, queue="reports"))
    except treadle.QueueFull as full:
        print(f"backpressure after {len(reports)} reports: {full}")
    assert len(reports) == 5

    print(f"report job {reports[0]} before any worker runs:")
    for reason in treadle.explain(conn, reports[0]):
        print(f"  {reason.reason}: {reason.message}")
    assert [r.reason for r in treadle.explain(conn, reports[0])] == ["paused", "no_worker"]

    began = time.monotonic()
    worker.start()
    results = [treadle.wait(conn, job_id, timeout=60) for job_id in calls]
    took = time.monotonic() - began
    assert all(r["confirmed"] for r in results)
    print(f"{len(calls)} partner calls in {took:.1f} s, at most {most_calling} at once (limit 2)")
    assert most_calling <= 2
    # a burst of 20, then 20 a second: the last 10 wait for their slots
    assert took >= 0.4, took

    job = treadle.get_job(conn, reports[0])
    assert job is not None and job.state == "available", "a paused queue runs nothing"
    treadle.resume(conn, "reports")
    done = [treadle.wait(conn, job_id, timeout=60) for job_id in reports]
    print(f"reports resumed and built: {[r['report'] for r in done]}")
    print(f"report job {reports[0]}: {treadle.explain(conn, reports[0])[0].message}")
    worker.stop()
