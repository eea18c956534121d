"""The raw baseline worker: the bare SKIP LOCKED cycle on bench_raw.jobs, in a process of its own.

It claims up to `concurrency` jobs with one statement, runs the handler on each,
then finishes them all and claims the next batch in one statement (one round trip
and one commit per batch, as treadle's worker with complete_and_claim); when a
claim comes back short it finishes what it ran, then waits for a NOTIFY on
bench_raw_jobs or the poll interval. No leases
are renewed, nothing is rescued: this is the least work a SKIP LOCKED queue can
do per job. Same pipe protocol and handlers as worker_treadle.py.

    python bench/worker_raw.py DSN [--concurrency 10] [--handler noop] [--no-listen] ...
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from typing import Any

import psycopg

from harness import RAW_APPLICATION, RAW_FINISH, raw_claim, raw_finish_and_claim

CHANNEL = "bench_raw_jobs"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dsn")
    p.add_argument("--queue", default="default")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--handler", choices=("noop", "record"), default="noop")
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--no-listen", action="store_true")
    args = p.parse_args()

    stop = threading.Event()

    def stop_when_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    record = args.handler == "record"
    claim = raw_claim(args.concurrency)
    finish_and_claim = raw_finish_and_claim(args.concurrency)
    params: dict[str, Any] = {"queue": args.queue, "name": "bench", "batch": args.concurrency,
                              "lease": "30 seconds", "worker_id": f"raw:{os.getpid()}"}

    with psycopg.connect(args.dsn, autocommit=True, application_name=RAW_APPLICATION) as conn, \
            psycopg.connect(args.dsn, autocommit=True, application_name=RAW_APPLICATION) as listen:
        if not args.no_listen:
            listen.execute(f"LISTEN {CHANNEL}")
        cur = conn.cursor()
        print("ready", flush=True)
        cur.execute(claim, params, prepare=True)
        rows = cur.fetchall()
        while not stop.is_set():
            for row in rows:
                if record:
                    print(f"start {row[0]} {time.time():.6f}", flush=True)
            if len(rows) == args.concurrency:
                cur.execute(finish_and_claim, {**params, "ids": [row[0] for row in rows]}, prepare=True)
                rows = cur.fetchall()
                continue
            if rows:
                cur.execute(RAW_FINISH, {"ids": [row[0] for row in rows]}, prepare=True)
            wait(listen, args.poll_interval, stop, args.no_listen)
            cur.execute(claim, params, prepare=True)
            rows = cur.fetchall()
    print(f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)


def wait(listen: psycopg.Connection[Any], seconds: float, stop: threading.Event, polling_only: bool) -> None:
    """Until a notification, the poll interval, or a stop."""
    deadline = time.monotonic() + seconds
    while not stop.is_set() and (remaining := deadline - time.monotonic()) > 0:
        if polling_only:
            stop.wait(min(remaining, 0.1))
        elif any(True for _ in listen.notifies(timeout=min(remaining, 0.1), stop_after=1)):
            return


if __name__ == "__main__":
    main()
