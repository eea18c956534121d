"""Dashboard searches on a large jobs table: what each filter costs, through the
dashboard's own Store (the statements its pages send), in milliseconds.

The table holds --rows jobs (default 10,000,000) in 20 queues, one finished every
5 ms up to now (720,000 in the last hour, which the queue page's chart reads):
mostly completed, some discarded with an error, some waiting; a tenth with an
idempotency key.
Searches by args, worker and error text have no index, so each page reads a window
of the newest jobs (the dashboard's search_window, 100,000 by default); the worst
case is a filter that matches nothing, which reads the whole window. The baseline
is the plainest page: the newest jobs, no filter. The last row is the same
no-match args search without a window, once per run, to show what the window saves.

    .build/venv/bin/python bench/dashboard_search.py [--rows 10000000] [--samples 5] [--runs 3]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from harness import Stopwatch, database, median, parser, print_settings, progress, ratio, server, spread, table
from psycopg_pool import ConnectionPool

from treadle.dashboard.queries import SEARCH, SearchFilter, Store

TITLE = "Dashboard search on a large jobs table: milliseconds per page"
WINDOW = 100_000
PAGE = 50
FILL = """
INSERT INTO treadle.jobs (queue, name, args, state, run_at, attempt, max_attempts, worker_id, idempotency_key,
                          last_error, created_at, started_at, finished_at, failed_at, errors)
SELECT 'q' || (g %% 20), 'sync_account',
       jsonb_build_object('account', g %% 100000, 'region', CASE WHEN g %% 3 = 0 THEN 'eu' ELSE 'us' END),
       s.state, t, CASE WHEN s.state = 'available' THEN 0 ELSE 1 END, 3,
       CASE WHEN s.state <> 'available' THEN 'host-' || (g %% 8) || ':worker' END,
       CASE WHEN g %% 10 = 0 THEN 'key-' || g END,
       CASE WHEN s.failed THEN 'ConnectionRefusedError: [Errno 111] Connection refused (' || (g %% 50) || ')' END,
       t, CASE WHEN s.state <> 'available' THEN t END,
       CASE WHEN s.state IN ('completed', 'discarded') THEN t END,
       CASE WHEN s.failed THEN t END,
       CASE WHEN s.failed
            THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'at', t, 'error',
                     'ConnectionRefusedError: [Errno 111] Connection refused (' || (g %% 50) || ')'))
            ELSE '[]' END
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
 CROSS JOIN LATERAL (SELECT now() - (%(rows)s::bigint - g) * interval '5 milliseconds' AS t) AS tt
 CROSS JOIN LATERAL (
       SELECT CASE WHEN g %% 100 < 90 THEN 'completed'
                   WHEN g %% 100 < 95 THEN 'discarded'
                   WHEN g %% 100 < 98 THEN 'available'
                   ELSE 'retryable' END AS state,
              g %% 100 >= 90 AND g %% 100 < 95 OR g %% 100 >= 98 AS failed) AS s
"""
# the search without its window: what a search by args would cost if it read every job
UNWINDOWED = "SET LOCAL statement_timeout = '120s'"


def fill(url: str, rows: int) -> None:
    chunk = 1_000_000
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, rows + 1, chunk):
            progress(f"filling: jobs {first:,} to {min(first + chunk - 1, rows):,} of {rows:,}")
            conn.execute(FILL, {"first": first, "last": min(first + chunk - 1, rows), "rows": rows})
        progress("VACUUM ANALYZE")
        conn.execute("VACUUM ANALYZE treadle.jobs")


def cases(store: Store, rows: int) -> list[tuple[str, str, Callable[[], Any]]]:
    """(label, what bounds what it reads, the call): searches and bulk counts as the pages make them.

    q11 holds discarded jobs (ids whose last two digits are 90 to 94 are discarded;
    q3 holds none, the worst case of a rare match); q15 holds 100,000 waiting jobs."""
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    then = SearchFilter(failed_after=hour_ago - timedelta(hours=1), failed_before=hour_ago)  # the hour before last
    some_key = f"key-{(rows // 10) * 10}"
    retry_states = frozenset({"discarded", "cancelled", "retryable"})

    def bound(where: SearchFilter) -> str:
        return "window" if where.windowed else "index"

    def search(label: str, where: SearchFilter) -> tuple[str, str, Callable[[], Any]]:
        return label, bound(where), lambda: store.search(where, page_size=PAGE, window=WINDOW)

    def bulk(label: str, where: SearchFilter) -> tuple[str, str, Callable[[], Any]]:
        return label, bound(where), lambda: store.plan_bulk(where, states=retry_states, window=WINDOW, limit=10_000)

    return [
        search("newest page, no filter (baseline)", SearchFilter()),
        search("queue q11, state discarded", SearchFilter(queue="q11", state="discarded")),
        search("queue q3, state discarded: none match", SearchFilter(queue="q3", state="discarded")),
        search("idempotency key with its queue", SearchFilter(queue=f"q{(rows // 10 * 10) % 20}", key=some_key)),
        search("idempotency key, no queue, none match", SearchFilter(key="nothing")),
        search("args {region: eu}: many match", SearchFilter(args={"region": "eu"})),
        search("args {account: -1}: none match", SearchFilter(args={"account": -1})),
        search("worker 'nobody': none match", SearchFilter(worker="nobody")),
        search("error text 'timeout': none match", SearchFilter(error="timeout")),
        search("error 'refused', q11, discarded", SearchFilter(queue="q11", state="discarded", error="refused")),
        search("failed in the hour before last, 'refused'", replace(then, error="refused")),
        search("failed then, 'timeout': none match", replace(then, error="timeout")),
        bulk("bulk retry count: q11 discarded", SearchFilter(queue="q11", state="discarded")),
        bulk("bulk retry count: failed then, 'refused'", replace(then, error="refused")),
        ("queue page q11: 25k failed jobs", "index", lambda: store.queue("q11", failures=20)),
        ("queue page q15: 100k waiting, no failure", "index", lambda: store.queue("q15", failures=20)),
    ]


def unwindowed(url: str) -> float:
    """The no-match args search over every job (no window), in milliseconds."""
    params = SearchFilter(args={"account": -1}).params() | {"limit": PAGE + 1, "floor": None}
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute(UNWINDOWED)
        with Stopwatch() as s:
            conn.execute(SEARCH, params, prepare=False).fetchall()
    return s.ms


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--rows", type=int, default=10_000_000, help="jobs in the table (default 10,000,000)")
    p.add_argument("--samples", type=int, default=5, help="timings per case and run; a run takes their median")
    args = p.parse_args()
    rows = 20_000 if args.smoke else args.rows
    with server() as url, database(url, "dashboard") as db:
        print_settings(db)
        fill(db, rows)
        pool: ConnectionPool[Any] = ConnectionPool(
            db, min_size=1, max_size=2, open=True, kwargs={"autocommit": True, "prepare_threshold": None}
        )
        store = Store(pool, owns_pool=True, statement_timeout_ms=60_000, exact_counts_up_to=100_000)
        measured = cases(store, rows)
        figures: dict[str, list[float]] = {label: [] for label, _, _ in measured}
        full: list[float] = []
        try:
            for run in range(args.runs):
                progress(f"run {run + 1}/{args.runs}")
                for label, _, case in measured:
                    case()  # warm the cache for this case
                    timings = []
                    for _ in range(args.samples):
                        with Stopwatch() as s:
                            case()
                        timings.append(s.ms)
                    figures[label].append(median(timings))
                full.append(unwindowed(db))
        finally:
            store.close()
        base = median(figures[measured[0][0]])
        table_rows = [
            [label, kind, spread(figures[label]), ratio(median(figures[label]), base)] for label, kind, _ in measured
        ]
        table_rows.append(["args {account: -1} with no window", "all rows", spread(full), ratio(median(full), base)])
        table(
            TITLE,
            ["search", "reads", "ms: median (range)", "x baseline"],
            table_rows,
            [
                f"{rows:,} jobs; median (range) of {args.runs} runs; "
                f"window: the newest {WINDOW:,} jobs; page: {PAGE} jobs; each run's figure is the median of "
                f"{args.samples} timings after one warm-up, through the dashboard's Store.",
                "The machine is shared and noisy (2 cores, other work running): read ratios, not absolutes.",
            ],
        )


if __name__ == "__main__":
    main()
