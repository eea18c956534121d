"""Scenario: a large history. Claims and the drain with N finished jobs in treadle.jobs
(jobs that keep an idempotency key stay there, and all do until archived), and with
N finished jobs in treadle.job_history (where treadle.archive moves the others),
beside tables of 10,000 and of 100,000 waiting jobs in the same run; then retention of
90% of the finished jobs.

The rows are written by INSERT ... SELECT as the owner (enqueue would take far longer),
each case in a database of its own: 10,000 waiting; 100,000 waiting (the large case's
backlog alone); N finished + 100,000 waiting; the same with the finished jobs in the
history, in the partitions treadle.archive would have put them in. Then the runs go round the cases; per run:
  - claim latency: p50 and p99 of claiming one job (autocommit treadle.claim, batch 1);
  - drain: claim 10 + treadle.complete_many in a loop on one connection, D jobs
    (D = 10,000 less the claims timed, so that the small case ends empty).
  The claimed jobs are put back after each run.
Then retention of the 0.9 N jobs finished more than 7 days ago (the default: 7 days):
  - one treadle.prune('7 days'): one statement;
  - the same rows written again, then treadle.apply_retention(batch) in a loop on one
    connection until it returns less than the batch (what the workers' housekeeping does);
  - in the history case, apply_retention(batch) in the same loop: it empties the 30
    partitions whose day has passed with TRUNCATE; then the cost of the history itself:
    0.1 N jobs finished two minutes ago moved by treadle.archive(batch) in a loop;
  each: seconds, WAL written (pg_current_wal_lsn before and after), the longest
  transaction, and the claim p50/p99 of a claimer claiming one job every 20 ms all the
  while, against the same claimer in the 10 s before.

    .build/venv/bin/python bench/scale.py [--finished 1000000] [--waiting 100000] [--batch 1000] [--runs 3]
    .build/venv/bin/python bench/scale.py --finished 10000000     # the 10M-row run: about 35 minutes here
    .build/venv/bin/python bench/scale.py --finished 10000000 --history-only  # without the rows in treadle.jobs
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import psycopg

from harness import (
    TREADLE_CLAIM,
    Stopwatch,
    database,
    fmt,
    median,
    parser,
    percentile,
    print_settings,
    progress,
    ratio,
    runs_text,
    server,
    spread,
    table,
)

TITLE = "A large history: claim latency (ms) and drain (jobs/s)"
SMALL = 10_000  # waiting jobs in the baseline case
SAMPLES = 500  # claims timed per run
WARMUP = 20
DRAIN_BATCH = 10
CLAIMER_PAUSE = 0.02  # seconds between the claims sampled while retention runs
QUIET = 10.0  # seconds the claimer samples before retention starts
CLAIM_PARAMS = {"worker_id": "bench", "queue": "default", "names": ["bench"], "name": "bench", "batch": 1,
                "lease": "30 seconds"}
COMPLETE_MANY = "SELECT job_id, state FROM treadle.complete_many(%(ids)s, %(tokens)s)"

# Finished jobs, oldest first, spread over the last 70 days: the 0.9 N finished more
# than 7 days ago are past the default retention. `first`..`last` picks a part of them.
FILL_COMPLETED = """
INSERT INTO treadle.jobs (queue, name, args, state, run_at, attempt, worker_id, lease_token, result,
                          created_at, started_at, finished_at)
SELECT 'default', 'done', jsonb_build_object('i', g), 'completed', t.at, 1, 'bench', gen_random_uuid(),
       '{{"ok": true}}', t.at, t.at, t.at
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
 CROSS JOIN LATERAL (SELECT {finished_at} AS at) AS t
"""
FILL_FINISHED = FILL_COMPLETED.format(finished_at="now() - interval '70 days' + g * (interval '70 days' / %(total)s)")
# jobs that finished two minutes ago: what treadle.archive moves next
FILL_RECENT = FILL_COMPLETED.format(finished_at="now() - interval '2 minutes'")
# The same finished jobs as treadle.archive leaves them in treadle.job_history: each with
# its purge time (finished_at + 7 days) in the partition of its day. The 0.9 N past
# their retention fill 30 partitions (a stretch of days each, as if retention had not
# run for a while); the rest, the 8 days ahead of now, one partition per day.
FILL_HISTORY = """
INSERT INTO treadle.job_history (id, queue, name, args, state, priority, run_at, attempt, max_attempts,
                                 worker_id, lease_token, result, created_at, started_at, finished_at,
                                 cancel_requested, errors, purge_at, slot)
SELECT nextval('treadle.jobs_id_seq'), 'default', 'done', jsonb_build_object('i', g), 'completed', 0, t.at, 1, 25,
       'bench', gen_random_uuid(), '{"ok": true}', t.at, t.at, t.at, false, '[]', t.at + interval '7 days',
       CASE WHEN t.at + interval '7 days' <= now()
            THEN 1 + least(29, floor((g - 1) * 30.0 / (%(total)s * 0.9)))::integer
            ELSE 31 + extract(day FROM treadle._history_day(t.at + interval '7 days')
                                     - treadle._history_day(now()))::integer END
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
 CROSS JOIN LATERAL (SELECT now() - interval '70 days' + g * (interval '70 days' / %(total)s) AS at) AS t
"""
HISTORY_SLOTS = """
INSERT INTO treadle.history_slots (slot, starts, ends)
SELECT h.slot,
       CASE WHEN h.slot <= 30 THEN min(h.purge_at) ELSE treadle._history_day(min(h.purge_at)) END,
       CASE WHEN h.slot <= 30 THEN max(h.purge_at) + interval '1 microsecond'
            ELSE treadle._history_day(min(h.purge_at)) + interval '1 day' END
  FROM treadle.job_history AS h
 GROUP BY h.slot
"""
FILL_WAITING = """
INSERT INTO treadle.jobs (queue, name, args, run_at, created_at)
SELECT 'default', 'bench', jsonb_build_object('i', g), now() - interval '1 hour', now() - interval '1 hour'
  FROM generate_series(1, %(waiting)s) AS g
"""
# Put the jobs the claims took back, so every run starts from the same rows.
UNCLAIM = """
UPDATE treadle.jobs
   SET state = 'available', attempt = 0, lease_until = NULL, lease_token = NULL, worker_id = NULL,
       started_at = NULL, finished_at = NULL, result = NULL
 WHERE name = 'bench' AND state <> 'available'
"""


@dataclass
class Case:
    label: str
    name: str  # of its database
    waiting: int
    finished: int = 0
    in_history: bool = False  # the finished jobs in treadle.job_history, not in treadle.jobs
    url: str = ""
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    drain: list[float] = field(default_factory=list)


@dataclass
class Removal:
    label: str
    seconds: float
    deleted: int
    wal_bytes: int
    longest_ms: float  # the longest single transaction
    calls: int
    before: list[float]  # claim ms sampled in the quiet before
    during: list[float]  # claim ms sampled while it ran


def claim_once(cur: psycopg.Cursor[Any]) -> float:
    """Claim one job; the milliseconds it took."""
    with Stopwatch() as s:
        cur.execute(TREADLE_CLAIM, CLAIM_PARAMS, prepare=True)
        rows = cur.fetchall()
    if len(rows) != 1:
        raise RuntimeError(f"a claim returned {len(rows)} jobs, expected 1")
    return s.ms


def drain(conn: psycopg.Connection[Any], jobs: int) -> float:
    """Jobs per second of claim 10 + complete_many on one connection, for `jobs` jobs."""
    cur = conn.cursor()
    done = 0
    params = dict(CLAIM_PARAMS)
    start = time.perf_counter()
    while done < jobs:
        params["batch"] = min(DRAIN_BATCH, jobs - done)
        cur.execute(TREADLE_CLAIM, params, prepare=True)
        rows = cur.fetchall()
        if not rows:
            raise RuntimeError(f"the drain found no job after {done} of {jobs}")
        cur.execute(COMPLETE_MANY, {"ids": [r[0] for r in rows], "tokens": [r[10] for r in rows]}, prepare=True)
        cur.fetchall()
        done += len(rows)
    return jobs / (time.perf_counter() - start)


def fill(conn: psycopg.Connection[Any], case: Case) -> float:
    """Empty the tables and write the case's rows; returns the seconds it took."""
    started = time.monotonic()
    conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs, treadle.job_history, treadle.history_slots CASCADE")
    if case.finished:
        fill_finished(conn, 1, case.finished, case.finished, FILL_HISTORY if case.in_history else FILL_FINISHED)
    if case.in_history:
        conn.execute(HISTORY_SLOTS)
    conn.execute(FILL_WAITING, {"waiting": case.waiting})
    conn.execute("VACUUM ANALYZE treadle.jobs")
    for (partition,) in conn.execute("SELECT inhrelid::regclass::text FROM pg_inherits "
                                     "WHERE inhparent = 'treadle.job_history'::regclass").fetchall():
        conn.execute(f"VACUUM ANALYZE {partition}")
    conn.execute("CHECKPOINT")  # so that flushing what was written does not land in the measurement
    return time.monotonic() - started


def fill_finished(conn: psycopg.Connection[Any], first: int, last: int, total: int, sql: str = FILL_FINISHED) -> None:
    """Write finished jobs first..last (of total), a million per statement."""
    for start in range(first, last + 1, 1_000_000):
        end = min(start + 999_999, last)
        progress(f"  writing finished jobs {start:,}..{end:,}")
        conn.execute(sql, {"first": start, "last": end, "total": total})


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute(UNCLAIM)
    conn.execute("VACUUM treadle.jobs")


def measure_run(url: str, case: Case, drain_jobs: int) -> None:
    """One run of a case: claims timed one by one, a drain, and the jobs put back."""
    with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        for _ in range(WARMUP):
            claim_once(cur)
        samples = [claim_once(cur) for _ in range(SAMPLES)]
        case.p50.append(percentile(samples, 50))
        case.p99.append(percentile(samples, 99))
        case.drain.append(drain(conn, drain_jobs))
        reset(admin)


class Claimer:
    """A thread claiming one job every CLAIMER_PAUSE seconds, recording how long each took."""

    def __init__(self, url: str) -> None:
        self.samples: list[tuple[float, float]] = []  # (monotonic time, ms)
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with psycopg.connect(self._url, autocommit=True) as conn:
                cur = conn.cursor()
                while not self._stop.is_set():
                    self.samples.append((time.monotonic(), claim_once(cur)))
                    self._stop.wait(CLAIMER_PAUSE)
        except BaseException as error:  # reported by the main thread
            self.error = error

    def __enter__(self) -> Claimer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def between(self, start: float, end: float) -> list[float]:
        return [ms for at, ms in self.samples if start <= at < end]


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_since(conn: psycopg.Connection[Any], lsn: str) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint", [lsn]).fetchone()
    assert row is not None
    return int(row[0])


def timed_removal(url: str, label: str, remove: Callable[[psycopg.Connection[Any]], tuple[int, int, float]]
                  ) -> Removal:
    """Run `remove(conn)` -> (rows deleted, calls, longest ms) beside a sampling claimer."""
    with psycopg.connect(url, autocommit=True) as conn, Claimer(url) as claimer:
        quiet_start = time.monotonic()
        time.sleep(QUIET)
        lsn = wal_lsn(conn)
        progress(f"{label}: running")
        start = time.monotonic()
        deleted, calls, longest = remove(conn)
        end = time.monotonic()
        wal = wal_since(conn, lsn)
    if claimer.error is not None:
        raise claimer.error
    progress(f"{label}: {deleted:,} jobs in {end - start:.1f} s")
    return Removal(label, end - start, deleted, wal, longest, calls,
                   claimer.between(quiet_start, start), claimer.between(start, end))


def prune_once(conn: psycopg.Connection[Any]) -> tuple[int, int, float]:
    with Stopwatch() as s:
        row = conn.execute("SELECT treadle.prune('7 days')").fetchone()
    assert row is not None
    return int(row[0]), 1, s.ms


def retention_batches(batch: int, function: str = "apply_retention"
                      ) -> Callable[[psycopg.Connection[Any]], tuple[int, int, float]]:
    """treadle.apply_retention (or treadle.archive) in a loop until it returns less than batch."""
    def run(conn: psycopg.Connection[Any]) -> tuple[int, int, float]:
        cur = conn.cursor()
        deleted = calls = 0
        longest = 0.0
        while True:
            with Stopwatch() as s:
                cur.execute(f"SELECT treadle.{function}(%s)", [batch], prepare=True)
                row = cur.fetchone()
            assert row is not None
            calls += 1
            deleted += int(row[0])
            longest = max(longest, s.ms)
            if row[0] < batch:
                return deleted, calls, longest
    return run


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--finished", type=int, default=1_000_000,
                   help="finished jobs in the large case (default 1,000,000)")
    p.add_argument("--waiting", type=int, default=100_000, help="waiting jobs in the large case (default 100,000)")
    p.add_argument("--batch", type=int, default=1000, help="apply_retention's batch (default 1000)")
    p.add_argument("--no-retention", action="store_true", help="part 1 only")
    p.add_argument("--history-only", action="store_true",
                   help="leave out the case with the finished jobs in treadle.jobs (and its two removals)")
    args = p.parse_args()
    global SAMPLES, QUIET
    small, finished, waiting = SMALL, args.finished, args.waiting
    if args.smoke:
        small, finished, waiting, SAMPLES, QUIET = 1_000, 20_000, 2_000, 30, 1.0
    drain_jobs = small - SAMPLES - WARMUP
    # Each case in a database of its own, all written first; then the runs go round
    # the cases, so that a quieter or busier minute on the machine falls on every case.
    cases = [Case(f"{small:,} waiting", "scale_small", waiting=small),
             Case(f"{waiting:,} waiting", "scale_backlog", waiting=waiting),
             Case(f"{finished:,} finished + {waiting:,} waiting", "scale", waiting=waiting, finished=finished),
             Case(f"{finished:,} finished in the history + {waiting:,} waiting", "scale_history", waiting=waiting,
                  finished=finished, in_history=True)]
    if args.history_only:
        del cases[2]
    history = cases[-1]
    old = finished * 9 // 10  # finished more than 7 days ago: past the default retention
    removals: list[Removal] = []
    began = time.monotonic()
    with server() as url, ExitStack() as stack:
        for case in cases:
            case.url = stack.enter_context(database(url, case.name))
        print_settings(cases[0].url)
        fills = []
        for case in cases:
            progress(f"{case.label}: filling")
            with psycopg.connect(case.url, autocommit=True) as conn:
                fills.append(fill(conn, case))
            progress(f"  {fills[-1]:.0f} s")
        for run in range(args.runs):
            for case in cases if run % 2 == 0 else cases[::-1]:
                progress(f"{case.label}: run {run + 1}/{args.runs}: {SAMPLES} claims, then a drain of {drain_jobs:,}")
                measure_run(case.url, case, drain_jobs)
        db = cases[2].url
        with psycopg.connect(db, autocommit=True) as conn:
            sizes = conn.execute("SELECT pg_size_pretty(pg_table_size('treadle.jobs')), "
                                 "pg_size_pretty(pg_indexes_size('treadle.jobs'))").fetchone()
            assert sizes is not None
        refill = 0.0
        if not args.no_retention and not args.history_only:
            removals.append(timed_removal(db, f"prune('7 days'): {old:,} jobs in one statement", prune_once))
            with psycopg.connect(db, autocommit=True) as conn:
                progress("vacuum, and the same jobs again")
                conn.execute("VACUUM treadle.jobs")
                started = time.monotonic()
                fill_finished(conn, 1, old, finished)
                conn.execute("VACUUM ANALYZE treadle.jobs")
                reset(conn)
                conn.execute("CHECKPOINT")
                refill = time.monotonic() - started
            removals.append(timed_removal(db, f"apply_retention({args.batch}) until done: {old:,} jobs",
                                          retention_batches(args.batch)))
        if not args.no_retention:
            removals.append(timed_removal(history.url, f"apply_retention({args.batch}) until done: {old:,} jobs "
                                          "in 30 partitions of treadle.job_history", retention_batches(args.batch)))
            # what the history costs: moving jobs there, here the 0.1 N finished a minute ago
            moving = finished - old
            with psycopg.connect(history.url, autocommit=True) as conn:
                progress(f"{moving:,} jobs finished two minutes ago, in treadle.jobs")
                conn.execute(FILL_RECENT, {"first": 1, "last": moving})
                conn.execute("VACUUM ANALYZE treadle.jobs")
                conn.execute("CHECKPOINT")
            removals.append(timed_removal(history.url, f"archive({args.batch}) until done: {moving:,} jobs moved "
                                          "to the history", retention_batches(args.batch, "archive")))
    total = time.monotonic() - began

    base = cases[0]
    rows = []
    for case in cases:
        rows.append([case.label, spread(case.p50), ratio(median(case.p50), median(base.p50)),
                     spread(case.p99), ratio(median(case.p99), median(base.p99)),
                     spread(case.drain, 0), ratio(median(case.drain), median(base.drain))])
    table(f"{TITLE}, {fmt(finished, 0)} finished jobs",
          ["case", "claim p50", "x small", "claim p99", "x small", "drain jobs/s", "x small"], rows,
          notes=[f"{SAMPLES} claims of one job per run, then a drain of {drain_jobs:,} jobs (claim {DRAIN_BATCH} + "
                 f"complete_many, one connection); {runs_text(args.runs)}: median (range). Goal: the large case "
                 "within 1.2x of the small one. Writing the large case took "
                 f"{fills[-1]:.0f} s (INSERT ... SELECT, VACUUM ANALYZE, CHECKPOINT); treadle.jobs then held "
                 f"{sizes[0]} of table and {sizes[1]} of indexes. Shared two-core machine: noisy."])
    if removals:
        rrows = []
        for r in removals:
            rrows.append([r.label, f"{r.seconds:.1f}", fmt(r.deleted / r.seconds, 0) if r.seconds else "-",
                          f"{r.wal_bytes / 2**20:,.0f}", f"{r.wal_bytes / max(r.deleted, 1):.0f}",
                          f"{r.calls:,}", fmt(r.longest_ms),
                          f"{fmt(percentile(r.before, 50))} / {fmt(percentile(r.before, 99))}",
                          f"{fmt(percentile(r.during, 50))} / {fmt(percentile(r.during, 99))}",
                          ratio(percentile(r.during, 99), percentile(r.before, 99)), str(len(r.during))])
        table(f"Retention of {fmt(old, 0)} of {fmt(finished, 0)} finished jobs",
              ["how", "seconds", "jobs/s", "WAL MiB", "WAL bytes/job", "transactions", "longest ms",
               "claim p50/p99 before", "claim p50/p99 during", "p99 x", "claims during"], rrows,
              notes=[f"One run each (the rows are written again between them: {refill:.0f} s). A claimer claims one "
                     f"job every {CLAIMER_PAUSE * 1000:.0f} ms throughout; 'before' is its {QUIET:.0f} s ahead of the "
                     f"removal. Whole scenario: {total / 60:.1f} min."])


if __name__ == "__main__":
    main()
