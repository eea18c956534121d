"""A worker in its own process, run by the `treadle worker` command and stopped with SIGTERM.

This file is both things at once:

- a module that defines `worker`, as your application's tasks module would; the command
  `treadle worker examples/worker_process.py` imports it and runs that worker until
  SIGTERM or SIGINT;
- run as a script, a demonstration: it enqueues three jobs, starts that command,
  waits for the jobs, then sends SIGTERM and checks that the worker stopped cleanly.

    DATABASE_URL=postgresql://localhost/app python examples/worker_process.py
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]

worker = treadle.Worker(DSN, queues=["reports"], concurrency=2)


@worker.register("build_report")
def build_report(args: dict, ctx: treadle.JobContext) -> dict:
    rows = sum(range(args["rows"]))
    return {"report": args["report"], "total": rows, "worker": ctx.worker_id}


def main() -> None:
    with psycopg.connect(DSN) as conn:
        ids = [treadle.enqueue(conn, "build_report", {"report": name, "rows": rows}, queue="reports")
               for name, rows in (("daily", 10), ("weekly", 70), ("monthly", 300))]

    command = shutil.which("treadle") or os.path.join(os.path.dirname(sys.executable), "treadle")
    process = subprocess.Popen([command, "worker", __file__])
    try:
        results = [treadle.wait(DSN, job_id, timeout=60) for job_id in ids]
    finally:
        process.send_signal(signal.SIGTERM)  # graceful: running handlers finish first
        status = process.wait(timeout=60)

    for result in results:
        print(f"{result['report']}: {result['total']} (by {result['worker']})")
    assert [r["total"] for r in results] == [45, 2415, 44850], results
    assert status == 0, status
    print("the worker process stopped cleanly on SIGTERM")


if __name__ == "__main__":
    main()
