"""Scenario 6, pick-up latency: from an enqueue's commit to its handler starting, on an idle worker.

One worker process waits on an empty queue; jobs are enqueued one at a time,
each in its own transaction, 20 ms apart. Latency: the handler's start time
(printed by the worker process) minus the moment the enqueue call returned,
on the machine's one clock. Twice: with LISTEN/NOTIFY, and polling only (the
worker's LISTEN turned off; what happens behind PgBouncer in transaction mode).
The raw baseline: bench/worker_raw.py, woken by a NOTIFY sent with a raw INSERT.

    .build/venv/bin/python bench/pickup.py [--jobs 200] [--poll-interval 1.0] [--runs 3]
"""

from __future__ import annotations

import time

import psycopg

from harness import (
    database,
    paired_ratio,
    parser,
    percentile,
    print_settings,
    progress,
    reset_tables,
    runs_text,
    server,
    spread,
    table,
    worker_processes,
)

TITLE = "Pick-up latency: enqueue commit to handler start, milliseconds"
GAP = 0.020  # seconds between enqueues
ENQUEUE = {
    "treadle": "SELECT treadle.enqueue('bench', '{}')",
    "raw": """
        WITH i AS (INSERT INTO bench_raw.jobs (queue, name, args, run_at, created_at)
                   VALUES ('default', 'bench', '{}', now(), now()) RETURNING id)
        SELECT id, pg_notify('bench_raw_jobs', 'default') FROM i
    """,
}


def latencies(url: str, kind: str, listen: bool, jobs: int, poll_interval: float) -> list[float]:
    """Milliseconds from each enqueue's return to its handler's start."""
    options = ["--handler", "record", "--poll-interval", str(poll_interval)] + ([] if listen else ["--no-listen"])
    enqueued: dict[int, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        reset_tables(conn)
        with worker_processes(kind, url, 1, options) as (proc,):
            time.sleep(0.3)  # idle: the worker is waiting, not in the middle of a claim
            cur = conn.cursor()
            next_at = time.monotonic()
            for _ in range(jobs):
                cur.execute(ENQUEUE[kind], prepare=True)
                row = cur.fetchone()
                enqueued[int(row[0])] = time.time()  # type: ignore[index]
                next_at += GAP
                time.sleep(max(0.0, next_at - time.monotonic()))
            deadline = time.monotonic() + poll_interval + 10
            while len(proc.starts) < jobs and time.monotonic() < deadline:
                time.sleep(0.05)
            starts = list(proc.starts)
    if len(starts) < jobs:
        raise TimeoutError(f"{kind}: {len(starts)} of {jobs} jobs started")
    return [(at - enqueued[job_id]) * 1000 for job_id, at in starts]


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=200, help="jobs per run (default 200, 20 ms apart)")
    p.add_argument("--poll-interval", type=float, default=1.0, help="both workers' poll interval (default 1.0 s)")
    args = p.parse_args()
    jobs = 20 if args.smoke else args.jobs
    poll = 0.2 if args.smoke else args.poll_interval

    figures: dict[tuple[str, bool], dict[str, list[float]]] = {}
    with server() as url, database(url, "pickup") as db:
        print_settings(db)
        for listen in (True, False):
            for run in range(args.runs):
                for kind in (("treadle", "raw") if run % 2 == 0 else ("raw", "treadle")):
                    progress(f"{kind}, {'LISTEN' if listen else 'polling only'}: run {run + 1}/{args.runs}")
                    ms = latencies(db, kind, listen, jobs, poll)
                    f = figures.setdefault((kind, listen), {"p50": [], "p99": []})
                    f["p50"].append(percentile(ms, 50))
                    f["p99"].append(percentile(ms, 99))

    rows = []
    for listen in (True, False):
        t, r = figures[("treadle", listen)], figures[("raw", listen)]
        rows.append([("LISTEN/NOTIFY" if listen else f"polling only, every {poll:g} s"),
                     spread(t["p50"]), spread(r["p50"]), paired_ratio(t["p50"], r["p50"]),
                     spread(t["p99"]), spread(r["p99"]), paired_ratio(t["p99"], r["p99"])])
    table(TITLE, ["wake-up", "treadle p50", "raw p50", "ratio", "treadle p99", "raw p99", "ratio"], rows,
          notes=[f"{jobs} jobs per run, {int(GAP * 1000)} ms apart, one idle worker (concurrency 10), "
                 f"{runs_text(args.runs)}: median (range) of the runs' percentiles. Goal: LISTEN p50 <= 3 ms."])


if __name__ == "__main__":
    main()
