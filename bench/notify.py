"""Scenario: finishes notify treadle_done only when a session waits on the queue.

Every notifying commit takes one lock in turn (PostgreSQL's NOTIFY queue), so
finishing jobs notifies only queues a session waits on (treadle.listen_done).
W worker processes (default 4, concurrency 10, empty handlers) drain N jobs, as in
load.py (jobs/s from the enqueue's commit to the last finished_at), in three
settings that alternate run by run:
  - nobody waits: no finish notifies;
  - a waiter on the queue: one session registered for the queue and LISTENing
    (a thread reads its notifications), so every finishing commit notifies;
  - always notify: treadle._notify_done replaced, for these drains only, by the
    behaviour before this change (NOTIFY treadle_done on every finish, nobody
    registered or listening), then put back.
The figure is each setting's rate, and its ratio to nobody waiting run by run.
A second table times the SQL cycle alone (one connection finishes 10 jobs and
claims 10 per statement, treadle.complete_and_claim, as load.py's last row) with
nobody waiting, always notifying, and treadle._notify_done emptied (no test, no
NOTIFY): the difference per statement is what the test for waiters costs a finish.
With --raw the same number of raw worker processes (bench/worker_raw.py, which
notify nothing) drain the same jobs beside each, as a baseline; off by default,
since four raw workers' one-statement finish-and-claim was seen to deadlock with
one another (a raw worker then dies and its drain never ends).

    .build/venv/bin/python bench/notify.py [--jobs 20000] [--workers 4] [--concurrency 10] [--runs 3] [--raw]
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from harness import database, paired_ratio, parser, print_settings, progress, runs_text, server, spread, table
from load import drain, sql_cycle

TITLE = "Notify: commit rate of worker processes with and without a session waiting for finishes"
NOTIFY_DONE = "treadle._notify_done(text[])"
REPLACE_NOTIFY_DONE = """
CREATE OR REPLACE FUNCTION treadle._notify_done(queues text[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    {body}
END;
$$
"""
ALWAYS_NOTIFY = REPLACE_NOTIFY_DONE.format(body="PERFORM pg_notify('treadle_done', q.q) FROM unnest(queues) AS q(q);")
NOTHING = REPLACE_NOTIFY_DONE.format(body="NULL;")
CYCLE_SETTINGS = ["nobody waits", "always notify (before)", "no test, no notify"]
SETTINGS = ["nobody waits", "a waiter on the queue", "always notify (before)"]


@contextmanager
def waiter(url: str, heard: list[int]) -> Iterator[None]:
    """A session waiting for finishes on queue 'default', reading its notifications until the end."""
    stop = threading.Event()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT treadle.listen_done('default')")
        conn.execute("LISTEN treadle_done")

        def read() -> None:
            while not stop.is_set():
                heard[0] += sum(1 for _ in conn.notifies(timeout=0.2))

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            conn.execute("SELECT treadle.unlisten_done()")


@contextmanager
def always_notify(url: str, definition: str = ALWAYS_NOTIFY) -> Iterator[None]:
    """treadle._notify_done as it behaved before (NOTIFY on every finish), or as `definition` says."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", [NOTIFY_DONE]).fetchone()
        assert row is not None
        conn.execute(definition)
        try:
            yield
        finally:
            conn.execute(row[0])


def drain_in(url: str, setting: str, kind: str, workers: int, concurrency: int, jobs: int,
             heard: list[int]) -> float:
    if kind == "raw" or setting == SETTINGS[0]:
        return drain(url, kind, workers, concurrency, jobs)[0]
    if setting == SETTINGS[1]:
        with waiter(url, heard):
            return drain(url, kind, workers, concurrency, jobs)[0]
    with always_notify(url):
        return drain(url, kind, workers, concurrency, jobs)[0]


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (default 20,000)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--concurrency", type=int, default=10, help="each worker's concurrency (default 10)")
    p.add_argument("--raw", action="store_true", help="drain with raw worker processes beside each setting")
    args = p.parse_args()
    kinds = ("treadle", "raw") if args.raw else ("treadle",)
    jobs = 300 if args.smoke else args.jobs

    results: dict[tuple[str, str], list[float]] = {}
    heard: dict[str, list[int]] = {s: [0] for s in SETTINGS}
    with server() as url, database(url, "notify") as db:
        print_settings(db)
        for run in range(args.runs):
            # the settings in a new order each run; treadle and raw alternate within each
            order = SETTINGS[run % 3:] + SETTINGS[:run % 3]
            for setting in order:
                for kind in (kinds if run % 2 == 0 else kinds[::-1]):
                    progress(f"{setting}, {kind}: run {run + 1}/{args.runs}, {args.workers} workers, {jobs:,} jobs")
                    rate = drain_in(db, setting, kind, args.workers, args.concurrency, jobs, heard[setting])
                    results.setdefault((setting, kind), []).append(rate)
                    progress(f"  {rate:,.0f} jobs/s")
        cycle: dict[str, list[float]] = {}
        for run in range(args.runs):
            for setting in CYCLE_SETTINGS[run % 3:] + CYCLE_SETTINGS[:run % 3]:
                progress(f"SQL cycle, {setting}: run {run + 1}/{args.runs}, {jobs:,} jobs")
                if setting == CYCLE_SETTINGS[0]:
                    rate = sql_cycle(db, "treadle", args.concurrency, jobs)
                else:
                    with always_notify(db, ALWAYS_NOTIFY if setting == CYCLE_SETTINGS[1] else NOTHING):
                        rate = sql_cycle(db, "treadle", args.concurrency, jobs)
                cycle.setdefault(setting, []).append(rate)
                progress(f"  {rate:,.0f} jobs/s")

    nobody = results[(SETTINGS[0], "treadle")]
    rows = []
    for setting in SETTINGS:
        t = results[(setting, "treadle")]
        row = [setting, spread(t, 0), paired_ratio(t, nobody), f"{heard[setting][0]:,}"]
        if args.raw:
            r = results[(setting, "raw")]
            row += [spread(r, 0), paired_ratio(t, r)]
        rows.append(row)
    notes = [f"{args.workers} worker processes x concurrency {args.concurrency}, empty handlers, {jobs:,} jobs per "
             f"drain, {runs_text(args.runs)}: median (range); the ratio to nobody waiting is taken run by run. "
             "Notifications: treadle_done heard by the waiter over all runs (one per finishing commit)."
             + (" Raw workers notify nothing in every row." if args.raw else "")]
    headers = ["setting", "treadle jobs/s", "ratio to nobody waiting", "notifications heard"]
    table(TITLE, headers + (["raw jobs/s", "ratio to raw"] if args.raw else []), rows, notes)

    bare = cycle[CYCLE_SETTINGS[2]]
    cycle_rows = []
    for setting in CYCLE_SETTINGS:
        rates = cycle[setting]
        # microseconds per statement (10 finishes and 10 claims) more than without test or notify
        extra = [(args.concurrency / r - args.concurrency / b) * 1e6 for r, b in zip(rates, bare)]
        cycle_rows.append([setting, spread(rates, 0), paired_ratio(rates, bare), spread(extra, 1)])
    table("Notify: the SQL cycle alone, one connection", ["setting", "jobs/s", "ratio to no test, no notify",
          "µs per statement over it"], cycle_rows,
          [f"finish {args.concurrency} + claim {args.concurrency} per statement (treadle.complete_and_claim), "
           f"{jobs:,} jobs, {runs_text(args.runs)}: median (range), ratios and differences run by run."])


if __name__ == "__main__":
    main()
