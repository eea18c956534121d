"""Scenario 5, enqueue rate: jobs per second, one job per transaction and in bulk.

Single: one autocommit transaction per job, on one connection, through the SQL
function, through the Python client, and as a raw single-row INSERT: the goal's
baseline on a cursor kept for the run with prepare=True, and beside it the idiomatic
`conn.execute` (a cursor per call, prepared after psycopg's threshold). Bulk: 100
and 10,000 jobs per call, through treadle.enqueue_many (SQL: one JSON document),
treadle.enqueue_arrays (SQL: one array per column), the Python client's
enqueue_many (which sends the arrays) and a raw INSERT ... SELECT from an array. The sides run in interleaved blocks,
so that each sees the same machine; both tables grow alike.

    .build/venv/bin/python bench/enqueue_rate.py [--jobs 5000] [--runs 3]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from harness import (
    RAW_INSERT,
    RAW_INSERT_SELECT,
    database,
    paired_ratio,
    parser,
    print_settings,
    progress,
    reset_tables,
    runs_text,
    server,
    spread,
    table,
)
from treadle.client import enqueue, enqueue_many

TITLE = "Enqueue rate: jobs per second"
SQL_ENQUEUE = "SELECT treadle.enqueue(%(name)s, %(args)s)"
SQL_ENQUEUE_MANY = "SELECT id FROM treadle.enqueue_many(%(jobs)s) AS id"
SQL_ENQUEUE_ARRAYS = "SELECT id FROM treadle.enqueue_arrays(%(name)s::text[], %(args)s::jsonb[]) AS id"
RAW_INSERT_SELECT_IDS = RAW_INSERT_SELECT + " RETURNING id"

# a side: (label, function that enqueues `count` jobs starting at `first`)
Side = tuple[str, Callable[[int, int], None]]


def single_sides(conn: psycopg.Connection[Any]) -> list[Side]:
    cur = conn.cursor()

    def sql(first: int, count: int) -> None:
        for i in range(first, first + count):
            cur.execute(SQL_ENQUEUE, {"name": "bench", "args": Jsonb({"i": i})}, prepare=True)
            cur.fetchone()

    def client(first: int, count: int) -> None:
        for i in range(first, first + count):
            enqueue(conn, "bench", {"i": i})

    def raw_execute(first: int, count: int) -> None:
        for i in range(first, first + count):
            conn.execute(RAW_INSERT, {"name": "bench", "args": Jsonb({"i": i})}).fetchone()

    def raw(first: int, count: int) -> None:
        for i in range(first, first + count):
            cur.execute(RAW_INSERT, {"name": "bench", "args": Jsonb({"i": i})}, prepare=True)
            cur.fetchone()

    return [("treadle.enqueue (SQL)", sql), ("treadle.enqueue (Python client)", client),
            ("raw INSERT, conn.execute", raw_execute), ("raw INSERT", raw)]  # fmt: skip


def bulk_sides(conn: psycopg.Connection[Any], size: int) -> list[Side]:
    cur = conn.cursor()

    def calls(first: int, count: int) -> list[range]:
        return [range(start, start + size) for start in range(first, first + count, size)]

    def sql(first: int, count: int) -> None:
        for ids in calls(first, count):
            cur.execute(SQL_ENQUEUE_MANY, {"jobs": Jsonb([{"name": "bench", "args": {"i": i}} for i in ids])},
                        prepare=True)
            cur.fetchall()

    def arrays(first: int, count: int) -> None:
        for ids in calls(first, count):
            cur.execute(SQL_ENQUEUE_ARRAYS, {"name": ["bench"] * len(ids), "args": [Jsonb({"i": i}) for i in ids]},
                        prepare=True)
            cur.fetchall()

    def client(first: int, count: int) -> None:
        for ids in calls(first, count):
            enqueue_many(conn, [{"name": "bench", "args": {"i": i}} for i in ids])

    def raw(first: int, count: int) -> None:
        for ids in calls(first, count):
            cur.execute(RAW_INSERT_SELECT_IDS, {"name": "bench", "args": [Jsonb({"i": i}) for i in ids]},
                        prepare=True)
            cur.fetchall()

    return [(f"treadle.enqueue_many (SQL), {size:,} per call", sql),
            (f"treadle.enqueue_arrays (SQL), {size:,} per call", arrays),
            (f"treadle.enqueue_many (Python client), {size:,} per call", client),
            (f"raw INSERT ... SELECT, {size:,} per call", raw)]


def measure(url: str, make_sides: Callable[[psycopg.Connection[Any]], list[Side]], jobs: int, block: int,
            runs: int, what: str) -> dict[str, list[float]]:
    """Jobs per second of each side, per run; sides alternate in blocks of `block` jobs."""
    rates: dict[str, list[float]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        sides = make_sides(conn)
        for run in range(runs):
            progress(f"{what}: run {run + 1}/{runs}, {jobs:,} jobs per side")
            reset_tables(conn)
            for _, enqueue in sides:  # warm up: connection check, prepared statements
                enqueue(10_000_000, block)
            seconds = {label: 0.0 for label, _ in sides}
            for n, first in enumerate(range(0, jobs, block)):
                order = sides[n % len(sides):] + sides[:n % len(sides)]
                for label, enqueue in order:
                    start = time.perf_counter()
                    enqueue(first, block)
                    seconds[label] += time.perf_counter() - start
            for label, s in seconds.items():
                rates.setdefault(label, []).append(jobs / s)
    return rates


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=5000, help="single-job transactions per run and side (default 5000)")
    p.add_argument("--bulk-jobs", type=int, default=30_000, help="jobs per run and side in bulk (default 30,000)")
    args = p.parse_args()
    single, bulk, sizes = args.jobs, args.bulk_jobs, (100, 10_000)
    if args.smoke:
        single, bulk, sizes = 60, 400, (20, 200)

    with server() as url, database(url, "enqueue") as db:
        print_settings(db)
        groups = [("single", measure(db, single_sides, single, max(single // 10, 1), args.runs, "single"))]
        for size in sizes:
            sides = lambda conn, size=size: bulk_sides(conn, size)  # noqa: E731
            groups.append((f"{size:,} per call",
                           measure(db, sides, max(bulk, size * 3), size, args.runs, f"{size:,} per call")))

    rows = []
    for _, rates in groups:
        labels = list(rates)
        raw = rates[labels[-1]]
        for label in labels:
            rows.append([label, spread(rates[label], 0), paired_ratio(rates[label], raw)])
    table(
        TITLE,
        ["path", "jobs/s", "ratio to raw"],
        rows,
        notes=[f"{runs_text(args.runs)}: median (range). Single: {single:,} autocommit transactions per side and run. "
               "Goals (issue 25): single enqueue >= 0.9 of raw INSERT (on a kept cursor, prepared), "
               "bulk >= 0.8 of raw INSERT ... SELECT."],
    )


if __name__ == "__main__":
    main()
