"""Scenario 1, load: worker processes with empty handlers drain a bulk-enqueued backlog.

W worker processes (treadle.Worker, concurrency C) start and wait; N jobs are
enqueued in one transaction; the figure is N over the time from that commit to
the last job's finished_at (the database's clock, so process start-up is not
counted). The raw baseline: W processes of bench/worker_raw.py, the bare
SKIP LOCKED claim of C jobs, then one statement that finishes them and claims
the next C, on bench_raw.jobs: the same round trips as treadle's worker.
CPU per job: the CPU time (user + system, /proc/PID/stat) the worker processes
and their server backends (found by application_name) used during the drain,
over the jobs; the server must run on this machine (else "-").
A row with a handler timeout (30 s, never reached) measures what timing every
attempt costs, a row with an `async def` handler what running it on the worker's
event loop costs, and a row without prepared statements (the worker prepares by
default on a direct connection, as here, and never through a pooler) what parsing
and planning each statement costs there; the raw worker has none of these and
always prepares, so it is the same baseline. A row with `claim_ahead` at three times
the concurrency (40 jobs held at concurrency 10, against 20 by default) measures what a
larger batch per statement gives.
A last row runs the SQL cycle alone, with no worker process: one connection
in this script finishes C jobs and claims C more per statement,
treadle.complete_and_claim against the raw statement, which splits the gap
between the cost of the SQL functions and the cost of the worker around them.

The curve: jobs/s against worker processes, treadle and raw side by side, the ratio
at each count, and each side against its own one process.

`--against DIR` runs a third side in the same turns: the worker of another source tree
(DIR is its python/src, say from `git archive` of an earlier commit, put first on
PYTHONPATH), on the same server and SQL; a last table compares this tree's worker with it.

    .build/venv/bin/python bench/load.py [--jobs 20000] [--workers 1 2 4] [--concurrency 10] [--runs 3] [--against DIR]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from harness import (
    RAW_APPLICATION,
    RAW_INSERT_SELECT,
    WorkerProcess,
    cpu_seconds,
    database,
    fmt,
    median,
    paired_ratio,
    parser,
    print_settings,
    progress,
    ratio,
    raw_claim,
    raw_finish_and_claim,
    reset_tables,
    runs_text,
    server,
    spread,
    table,
    worker_processes,
)

TITLE = "Load: jobs per second through worker processes, empty handlers"
CURVE_TITLE = "Load: the curve over worker processes, jobs per second"
AGAINST_TITLE = "Load: this tree's worker against another tree's (--against)"
SEED_ONE_WORKER = 863  # jobs/s, the seed's one worker at concurrency 10
CHUNK = 5000  # jobs per enqueue statement
# the rows of one worker whose handler has a timeout, whose handler is an async def,
# without prepared statements (what a worker does through a pooler), and holding more jobs ahead
TIMED, ASYNC, UNPREPARED, AHEAD = -1, -2, -3, -4
TABLE = {"treadle": "treadle.jobs", "raw": "bench_raw.jobs"}
APPLICATION = {"treadle": "treadle-worker:%", "raw": RAW_APPLICATION}  # the workers' connections
COMPLETE_AND_CLAIM = """
SELECT finished_id, (job).id, (job).lease_token
  FROM treadle.complete_and_claim(%(ids)s, %(tokens)s, NULL, %(worker_id)s, ARRAY[%(queue)s], %(names)s,
                                  %(batch)s, %(lease)s::interval)
"""


class CpuMeter:
    """CPU seconds the worker processes and their server backends use from now on (/proc/PID/stat)."""

    def __init__(self, conn: psycopg.Connection[Any], kind: str, procs: list[WorkerProcess]) -> None:
        self._conn, self._kind = conn, kind
        self._workers = {p.proc.pid: cpu_seconds(p.proc.pid) or 0.0 for p in procs}
        self._backends = {pid: cpu_seconds(pid) or 0.0 for pid in self._backend_pids()}

    def _backend_pids(self) -> list[int]:
        rows = self._conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                                  [APPLICATION[self._kind]]).fetchall()
        return [int(r[0]) for r in rows]

    def used(self) -> tuple[float | None, float | None]:
        """(worker processes, server backends) CPU seconds since the start; None where /proc cannot tell."""
        def since(start: dict[int, float], pids: list[int]) -> float | None:
            now = {pid: cpu_seconds(pid) for pid in pids}
            seen = [(pid, t) for pid, t in now.items() if t is not None]
            # a backend that started during the drain used all of its time in it
            return sum(t - start.get(pid, 0.0) for pid, t in seen) if seen else None
        return since(self._workers, list(self._workers)), since(self._backends, self._backend_pids())


@contextmanager
def python_path(src: Path | None) -> Iterator[None]:
    """Worker processes started inside import treadle from `src` first (None: this tree's)."""
    if src is None:
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def enqueue_backlog(conn: psycopg.Connection[Any], kind: str, jobs: int) -> float:
    """Enqueue `jobs` in one transaction; returns the database's clock right after the commit (epoch s)."""
    with conn.transaction():
        for first in range(0, jobs, CHUNK):
            ids = range(first, min(first + CHUNK, jobs))
            if kind == "treadle":
                conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)",
                             [Jsonb([{"name": "bench", "args": {"i": i}} for i in ids])])
            else:
                conn.execute(RAW_INSERT_SELECT, {"name": "bench", "args": [Jsonb({"i": i}) for i in ids]})
        if kind == "raw":
            conn.execute("SELECT pg_notify('bench_raw_jobs', 'default')")
        # statistics of this backlog, before the drain begins (ANALYZE counts this transaction's own
        # rows): TRUNCATE keeps a table's old statistics, and the plans of either side would
        # otherwise depend on what an autovacuum last saw
        conn.execute(f"ANALYZE {TABLE[kind]}")
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def drain(url: str, kind: str, workers: int, concurrency: int, jobs: int,
          watch: Callable[[list[WorkerProcess]], None] | None = None,
          on_ready: Callable[[list[WorkerProcess]], None] | None = None,
          cpu: list[tuple[float | None, float | None]] | None = None,
          options: list[str] | None = None) -> tuple[float, list[int]]:
    """Jobs per second for one drain, and each worker's peak RSS in KiB.

    With `cpu`, appends the (worker processes, server backends) CPU seconds per job.

    `on_ready(procs)` is called once the workers wait for work, `watch(procs)` about
    every 0.1 s while they drain and once after.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        reset_tables(conn)
        with worker_processes(kind, url, workers, ["--concurrency", str(concurrency), *(options or [])]) as procs:
            if on_ready is not None:
                on_ready(procs)
            meter = CpuMeter(conn, kind, procs)
            start = enqueue_backlog(conn, kind, jobs)
            deadline = time.monotonic() + 60 + jobs / 50
            count = f"SELECT count(*) FROM {TABLE[kind]} WHERE finished_at IS NOT NULL"
            while (done := conn.execute(count).fetchone()[0]) < jobs:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{kind}: {done} of {jobs} jobs finished in time")
                if watch is not None:
                    watch(procs)
                time.sleep(0.1)
            if watch is not None:
                watch(procs)
            row = conn.execute(f"SELECT extract(epoch FROM max(finished_at))::float8 FROM {TABLE[kind]}").fetchone()
            if cpu is not None:
                worker_s, server_s = meter.used()
                cpu.append((None if worker_s is None else worker_s / jobs,
                            None if server_s is None else server_s / jobs))
        end = float(row[0])  # type: ignore[index]
    return jobs / (end - start), [p.maxrss_kib or 0 for p in procs]


def sql_cycle(url: str, kind: str, batch: int, jobs: int) -> float:
    """Jobs per second of finish-and-claim in a loop on one connection, no worker process."""
    params = {"worker_id": "cycle", "queue": "default", "names": ["bench"], "name": "bench", "batch": batch,
              "lease": "30 seconds"}
    with psycopg.connect(url, autocommit=True) as conn:
        reset_tables(conn)
        enqueue_backlog(conn, kind, jobs)
        cur = conn.cursor()
        start = time.perf_counter()
        ids: list[int] = []
        tokens: list[Any] = []
        while True:
            if kind == "treadle":
                cur.execute(COMPLETE_AND_CLAIM, {**params, "ids": ids, "tokens": tokens}, prepare=True)
                claimed = [r for r in cur.fetchall() if r[0] is None]
                ids, tokens = [r[1] for r in claimed], [r[2] for r in claimed]
            else:
                cur.execute(raw_finish_and_claim(batch) if ids else raw_claim(batch), {**params, "ids": ids},
                            prepare=True)
                ids = [r[0] for r in cur.fetchall()]
            if not ids:
                break
        return jobs / (time.perf_counter() - start)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (default 20,000)")
    p.add_argument("--workers", type=lambda v: [int(w) for w in v.split(",")], nargs="+", default=[[1, 2, 4]],
                   help="worker process counts, as 1 2 4 or 1,2,4 (default 1 2 4)")
    p.add_argument("--concurrency", type=int, default=10, help="each worker's concurrency (default 10)")
    p.add_argument("--against", type=Path, default=None,
                   help="another tree's python/src: its worker runs as a third side, in the same turns")
    args = p.parse_args()
    if args.against is not None and not (args.against / "treadle" / "worker.py").is_file():
        p.error(f"--against {args.against}: no treadle/worker.py there (give a tree's python/src)")
    sides = ("treadle", "raw", "against") if args.against is not None else ("treadle", "raw")
    # a tree from before claim_ahead (0.3.0) sits out that row
    against_ahead = args.against is not None and "claim_ahead" in (args.against / "treadle" / "worker.py").read_text()
    args.workers = sorted({w for group in args.workers for w in group})
    jobs = 300 if args.smoke else args.jobs

    # a row: (its key, its label, worker processes, the treadle worker's options)
    rows_run: list[tuple[int, str, int, list[str]]] = [
        *((w, f"{w} x concurrency {args.concurrency}", w, []) for w in args.workers),
        (TIMED, f"1 x concurrency {args.concurrency}, handler timeout 30 s", 1, ["--timeout", "30"]),
        (ASYNC, f"1 x concurrency {args.concurrency}, async def handler", 1, ["--handler", "async-noop"]),
        (UNPREPARED, f"1 x concurrency {args.concurrency}, prepared_statements=False", 1, ["--unprepared"]),
        (AHEAD, f"1 x concurrency {args.concurrency}, claim_ahead={3 * args.concurrency}", 1,
         ["--claim-ahead", str(3 * args.concurrency)]),
    ]
    results: dict[tuple[str, int], list[float]] = {}
    rss: dict[tuple[str, int], list[int]] = {}
    cpu: dict[tuple[str, int], list[tuple[float | None, float | None]]] = {}
    with server() as url, database(url, "load") as db:
        print_settings(db)
        for w, label, processes, options in rows_run:
            for run in range(args.runs):
                for side in (sides if run % 2 == 0 else sides[::-1]):
                    if side == "against" and w == AHEAD and not against_ahead:
                        continue
                    progress(f"{label}, {side}: run {run + 1}/{args.runs}, {jobs:,} jobs")
                    kind = "raw" if side == "raw" else "treadle"
                    with python_path(args.against if side == "against" else None):
                        rate, peaks = drain(db, kind, processes, args.concurrency, jobs,
                                            cpu=cpu.setdefault((side, w), []),
                                            options=options if kind == "treadle" else [])
                    results.setdefault((side, w), []).append(rate)
                    rss.setdefault((side, w), []).extend(peaks)
                    progress(f"  {fmt(rate, 0)} jobs/s")
        for run in range(args.runs):
            for kind in (("treadle", "raw") if run % 2 == 0 else ("raw", "treadle")):
                progress(f"SQL cycle, {kind}: run {run + 1}/{args.runs}, {jobs:,} jobs")
                results.setdefault((kind, 0), []).append(sql_cycle(db, kind, args.concurrency, jobs))

    def ms_per_job(kind: str, w: int, part: int) -> str:
        values = [v * 1000 for c in cpu[(kind, w)] if (v := c[part]) is not None]
        return spread(values, 3) if values else "-"

    rows = []
    for w, label, _, _ in rows_run:
        t, r = results[("treadle", w)], results[("raw", w)]
        rows.append([label, spread(t, 0), spread(r, 0), paired_ratio(t, r),
                     ms_per_job("treadle", w, 0), ms_per_job("raw", w, 0),
                     ms_per_job("treadle", w, 1), ms_per_job("raw", w, 1),
                     f"{max(rss[('treadle', w)]) / 1024:.1f}", f"{max(rss[('raw', w)]) / 1024:.1f}"])
    t, r = results[("treadle", 0)], results[("raw", 0)]
    rows.append([f"SQL cycle only: finish {args.concurrency} + claim {args.concurrency} per statement, "
                 "one connection", spread(t, 0), spread(r, 0), paired_ratio(t, r), "-", "-", "-", "-", "-", "-"])
    notes = [f"{jobs:,} jobs per drain, {runs_text(args.runs)}: median (range). The seed: {SEED_ONE_WORKER} jobs/s "
             "for one worker, 4,750 for eight. Goals: one worker >= 0.8 of raw and "
             f"> {10 * SEED_ONE_WORKER:,} jobs/s, CPU per job (worker + server) <= 0.13 ms; two workers faster "
             "than one. CPU ms per job: user + system time of the worker processes and of their server "
             "backends during the drain, over the jobs."]
    if 1 in args.workers and 2 in args.workers:
        def scaling(kind: str) -> str:
            return ratio(median(results[(kind, 2)]), median(results[(kind, 1)]))
        notes.append(f"Two workers against one: treadle x{scaling('treadle')}, raw x{scaling('raw')}.")
    table(TITLE, ["workers", "treadle jobs/s", "raw jobs/s", "ratio", "treadle worker CPU ms/job",
                  "raw worker CPU ms/job", "treadle server CPU ms/job", "raw server CPU ms/job",
                  "treadle peak RSS MiB", "raw peak RSS MiB"], rows, notes)

    if args.against is not None:
        against = []
        for w, label, _, _ in rows_run:
            if ("against", w) not in results:
                continue
            t, a = results[("treadle", w)], results[("against", w)]
            against.append([label, spread(t, 0), spread(a, 0), paired_ratio(t, a),
                             paired_ratio(t, results[("raw", w)]), paired_ratio(a, results[("raw", w)]),
                             ms_per_job("treadle", w, 0), ms_per_job("against", w, 0),
                             ms_per_job("treadle", w, 1), ms_per_job("against", w, 1)])
        table(AGAINST_TITLE, ["workers", "this tree jobs/s", "--against jobs/s", "ratio this / against",
                              "this / raw", "against / raw", "this worker CPU ms/job", "against worker CPU ms/job",
                              "this server CPU ms/job", "against server CPU ms/job"], against,
              [f"--against {args.against}: its worker in the same turns as this tree's and raw's, on the same "
               "server and SQL; median (range), ratios run by run."])

    if len(args.workers) > 1:
        curve = []
        first = args.workers[0]
        for w in args.workers:
            t, r = results[("treadle", w)], results[("raw", w)]
            curve.append([str(w), spread(t, 0), paired_ratio(t, results[("treadle", first)]), spread(r, 0),
                          paired_ratio(r, results[("raw", first)]), paired_ratio(t, r)])
        table(CURVE_TITLE, ["worker processes", "treadle jobs/s", f"x {first}", "raw jobs/s", f"x {first}",
                            "ratio treadle / raw"], curve,
              [f"The rows above by process count (concurrency {args.concurrency} each). Goal: each count >= 0.8 of "
               "the same number of raw processes."])


if __name__ == "__main__":
    main()
