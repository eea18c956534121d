"""Scenario, many queues: a worker that names many queues, against one that names one.

Drain: one treadle worker process (concurrency 10, empty handlers) serves 100
queues, each holding an equal share of the jobs (all of them hold work while it
drains), against one that serves 1 queue holding all of them: the same total,
enqueued in one transaction, jobs/s from that commit to the last finished_at
(as bench/load.py), and the CPU milliseconds per job of the worker process and its
server backends. The two alternate run by run, and the ratio is taken run by run.

Claim cost: p50 and p99 of one `treadle.claim(..., names => ARRAY['bench'],
batch => 1)` (what a worker calls) naming 1, 10, 100 and 1,000 queues, each queue
holding a few waiting jobs, and naming 10, 100 and 1,000 queues of which one holds
work (sparse: each claim after the first finds every other queue empty); the cases
interleaved sample by sample, each beside the raw SKIP LOCKED claim of one job from
the same queues (`queue = ANY(...)`) on a bare copy of the same rows. The figure to
read is each side against its own 1-queue case. Each side and case claims on a
connection of its own, so that its backend's CPU time (/proc) gives the server CPU
per claim. The list is built once per case, as a worker builds its own. Sides:
"treadle", the claim sending its list as a parameter at every call, prepared (as the
worker sent it before); "worker", the worker's own statement as it sends it on a
direct connection (treadle._producer.claim_statements: its queues, job names, id and
lease written into the text of the statement, which is prepared once: nothing to
send or parse per call); as through a pooler (prepared statements off), unprepared,
the worker's statement as it sends it there ("pooler, list as parameter": the fixed
arguments sent as parameters) against the same with them written into its text
("pooler, list in text"); and raw.

    .build/venv/bin/python bench/queues.py [--jobs 20000] [--queues 100] [--claim-queues 1 10 100 1000]
                                          [--samples 500] [--runs 3] [--against FILE] [--no-sparse]

--against FILE: a file that creates another treadle.claim (say, the previous
release's, as `CREATE OR REPLACE FUNCTION treadle.claim(...)`); every drain and claim
case is then also run with it, the two claims alternating drain by drain (swapped in
between) and sample by sample (the other one installed as treadle_against.claim).
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from harness import (
    Stopwatch,
    cpu_seconds,
    database,
    fmt,
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
from load import CpuMeter
from treadle._producer import claim_statements

TITLE = "Many queues: one worker over N queues, and the claim's cost against the queues it names"
CHUNK = 5000  # jobs per enqueue statement
WARMUP = 20
TREADLE_CLAIM = """
SELECT * FROM treadle.claim(worker_id => 'bench', queues => %(queues)s, names => ARRAY['bench'],
                            batch => 1, lease => '30 seconds'::interval)
"""
RAW_CLAIM = """
WITH c AS (
    SELECT id FROM bench_raw.jobs
     WHERE queue = ANY(%(queues)s) AND name = 'bench'
       AND state = ANY('{available,retryable}') AND run_at <= now()
     ORDER BY priority, run_at, id
     LIMIT 1
       FOR UPDATE SKIP LOCKED)
UPDATE bench_raw.jobs AS j
   SET state = 'running', attempt = j.attempt + 1, lease_until = now() + '30 seconds'::interval,
       lease_token = gen_random_uuid(), worker_id = 'bench', started_at = now()
  FROM c WHERE j.id = c.id
RETURNING j.*
"""
# The same rows in both tables: `per_queue` jobs in each queue `c<count>-<i>`, one queue
# after the other in run_at order, so that claims go round the queues.
FILL = """
INSERT INTO {table} (queue, name, args, run_at, created_at)
SELECT %(prefix)s || (g %% %(count)s), 'bench', jsonb_build_object('i', g),
       now() - interval '1 hour' + g * interval '1 millisecond', now() - interval '1 hour'
  FROM generate_series(0, %(count)s * %(per_queue)s - 1) AS g
"""


# the sides of the claim's cost (see above); the worker's statement sent: (prepared, list written in)
SIDES = ("treadle", "worker", "pooler, list in text", "pooler, list as parameter", "raw")
WORKER_SIDES = {"worker": (True, True), "pooler, list in text": (False, True),
                "pooler, list as parameter": (False, False)}


def queue_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


# --- drain ------------------------------------------------------------------------------------

def drain(url: str, queues: int, concurrency: int, jobs: int, cpu: list[tuple[float | None, float | None]]) -> float:
    """Jobs per second of one worker serving `queues` queues (`q-<i>`), the jobs spread evenly over them."""
    with psycopg.connect(url, autocommit=True) as conn:
        reset_tables(conn)
        options = ["--concurrency", str(concurrency), "--queue", "q", "--queue-count", str(queues)]
        with worker_processes("treadle", url, 1, options) as procs:
            meter = CpuMeter(conn, "treadle", procs)
            with conn.transaction():
                for first in range(0, jobs, CHUNK):
                    specs = [{"name": "bench", "queue": f"q-{i % queues}", "args": {"i": i}}
                             for i in range(first, min(first + CHUNK, jobs))]
                    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(specs)])
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            assert row is not None
            start = float(row[0])
            deadline = time.monotonic() + 60 + jobs / 50
            count = "SELECT count(*) FROM treadle.jobs WHERE finished_at IS NOT NULL"
            while (done := conn.execute(count).fetchone()[0]) < jobs:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{queues} queues: {done} of {jobs} jobs finished in time")
                time.sleep(0.1)
            end = conn.execute("SELECT extract(epoch FROM max(finished_at))::float8 FROM treadle.jobs").fetchone()
            worker_s, server_s = meter.used()
            cpu.append((None if worker_s is None else worker_s / jobs, None if server_s is None else server_s / jobs))
    return jobs / (float(end[0]) - start)  # type: ignore[index]


# --- claim cost -------------------------------------------------------------------------------

# A case: the queues named, and whether only the first of them holds work (sparse).
Case = tuple[int, bool]


def case_queues(case: Case) -> list[str]:
    count, sparse = case
    return queue_names(f"{'s' if sparse else 'c'}{count}-", count)


def case_text(case: Case) -> str:
    count, sparse = case
    return f"{count:,}" + (", 1 with work" if sparse else "")


def fill(conn: psycopg.Connection[Any], cases: list[Case], claims: int) -> None:
    """For each case, its queues holding enough jobs between them for `claims` claims, 2 at least
    each (a sparse case: all of them in its first queue)."""
    reset_tables(conn)
    for count, sparse in cases:
        held = 1 if sparse else count
        per_queue = max(2, -(-claims // held) + 1)
        for name in ("treadle.jobs", "bench_raw.jobs"):
            conn.execute(FILL.format(table=name), {"prefix": f"{'s' if sparse else 'c'}{count}-", "count": held,
                                                   "per_queue": per_queue})
    for name in ("treadle.jobs", "bench_raw.jobs"):
        conn.execute(f"VACUUM ANALYZE {name}")


def claim_cost(url: str, cases: list[Case], samples: int, runs: int,
               against: bool = False) -> dict[tuple[str, Case, int], list[float]]:
    """Per (side, case, percentile): each run's figure; percentile 0 holds the server CPU
    microseconds per claim (the backend's /proc figures: one connection per side and case).
    Cases and sides interleaved sample by sample."""
    figures: dict[tuple[str, Case, int], list[float]] = {}
    sides = SIDES + (("against",) if against else ())
    queries = {"treadle": TREADLE_CLAIM, "raw": RAW_CLAIM,
               "against": TREADLE_CLAIM.replace("treadle.claim(", "treadle_against.claim(")}
    lists = {case: case_queues(case) for case in cases}  # built once, as a worker builds its list
    # the worker's statement over each case's queues, built as the worker builds it, and
    # the same claim taking every argument as a parameter (the worker's statement before)
    worker = {case: claim_statements("bench", lists[case], ["bench"], timedelta(seconds=30))[0] for case in cases}
    with psycopg.connect(url, autocommit=True) as admin:
        conns = {(side, case): psycopg.connect(url, autocommit=True) for side in sides for case in cases}
        try:
            pids = {key: int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
                    for key, conn in conns.items()}

            def claim(side: str, case: Case) -> float:
                conn = conns[(side, case)]
                with Stopwatch() as s:
                    if side in WORKER_SIDES:
                        # as WorkerPool.tuples sends it, on a connection that prepares or not
                        prepared, written = WORKER_SIDES[side]
                        fixed = worker[case]
                        query, params = fixed.query(prepared, {"batch": 1, "lease_token": str(uuid.uuid4())})
                        if written:
                            assert fixed.written is not None
                            query, params = fixed.written, {"batch": 1, "lease_token": str(uuid.uuid4())}
                        cur = conn.execute(query, params, prepare=prepared)
                    else:
                        cur = conn.execute(queries[side], {"queues": lists[case]}, prepare=True)
                    got = len(cur.fetchall())
                if got != 1:
                    raise RuntimeError(f"{side}, {case_text(case)} queues: a claim returned {got} jobs, expected 1")
                return s.ms

            for run in range(runs):
                progress(f"claim cost: run {run + 1}/{runs}, filling {len(cases)} cases")
                # every treadle side takes from treadle.jobs
                fill(admin, cases, (samples + WARMUP) * (len(sides) - 1))
                times: dict[tuple[str, Case], list[float]] = {}
                cpu_at: dict[tuple[str, Case], float | None] = {}
                for i in range(WARMUP + samples):
                    if i == WARMUP:
                        cpu_at = {key: cpu_seconds(pid) for key, pid in pids.items()}
                    # rotate the order of cases and sides, so that none always follows another
                    order = cases[i % len(cases):] + cases[:i % len(cases)]
                    for case in order:
                        turn = (i + run) % len(sides)
                        for side in sides[turn:] + sides[:turn]:
                            ms = claim(side, case)
                            if i >= WARMUP:
                                times.setdefault((side, case), []).append(ms)
                for (side, case), values in times.items():
                    figures.setdefault((side, case, 50), []).append(percentile(values, 50))
                    figures.setdefault((side, case, 99), []).append(percentile(values, 99))
                    before, after = cpu_at.get((side, case)), cpu_seconds(pids[(side, case)])
                    if before is not None and after is not None:
                        figures.setdefault((side, case, 0), []).append((after - before) * 1e6 / samples)
        finally:
            for conn in conns.values():
                conn.close()
    return figures


def claim_sources(url: str, against: str) -> dict[str, str]:
    """The installed treadle.claim's definition and FILE's (as written), by side; FILE's also
    created as treadle_against.claim."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_get_functiondef('treadle.claim(text, text[], text[], integer, interval, uuid)'"
                           "::regprocedure)").fetchone()
        assert row is not None
        other = open(against).read()
        conn.execute("CREATE SCHEMA IF NOT EXISTS treadle_against")
        conn.execute(re.sub(r"\btreadle\.claim\(", "treadle_against.claim(", other, count=1)
                     .replace("COMMENT ON FUNCTION treadle.claim(", "COMMENT ON FUNCTION treadle_against.claim("))
    return {"treadle": str(row[0]), "against": other}


def install_claim(url: str, source: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(source)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (default 20,000)")
    p.add_argument("--queues", type=int, default=100, help="queues the many-queue worker serves (default 100)")
    p.add_argument("--concurrency", type=int, default=10, help="the worker's concurrency (default 10)")
    p.add_argument("--claim-queues", type=int, nargs="+", default=[1, 10, 100, 1000],
                   help="queue counts of the claim cases (default 1 10 100 1000)")
    p.add_argument("--samples", type=int, default=500, help="claims timed per run, case and side (default 500)")
    p.add_argument("--against", metavar="FILE", help="SQL creating another treadle.claim, run beside the installed one")
    p.add_argument("--no-sparse", action="store_true", help="leave out the cases where one queue of many holds work")
    args = p.parse_args()
    jobs, samples, counts = args.jobs, args.samples, sorted(set(args.claim_queues))
    if args.smoke:
        jobs, samples = 300, 30
    if 1 not in counts:
        p.error("--claim-queues must include 1: every case is read against it")

    rates: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[tuple[float | None, float | None]]] = {}
    cases = [1, args.queues]
    with server() as url, database(url, "queues") as db:
        print_settings(db)
        sources = claim_sources(db, args.against) if args.against else {}
        variants = list(sources) or ["treadle"]
        for run in range(args.runs):
            for variant in (variants if run % 2 == 0 else variants[::-1]):
                if sources:
                    install_claim(db, sources[variant])
                for queues in (cases if run % 2 == 0 else cases[::-1]):
                    progress(f"drain, {variant}, 1 worker over {queues} queues: run {run + 1}/{args.runs}, {jobs:,} jobs")
                    rate = drain(db, queues, args.concurrency, jobs, cpu.setdefault((variant, queues), []))
                    rates.setdefault((variant, queues), []).append(rate)
                    progress(f"  {fmt(rate, 0)} jobs/s")
        if sources:
            install_claim(db, sources["treadle"])
        claim_cases: list[Case] = [(count, False) for count in counts]
        if not args.no_sparse:
            claim_cases += [(count, True) for count in counts if count > 1]
        figures = claim_cost(db, claim_cases, samples, args.runs, against=bool(sources))

    def ms_per_job(key: tuple[str, int], part: int) -> str:
        values = [v * 1000 for c in cpu[key] if (v := c[part]) is not None]
        return spread(values, 3) if values else "-"

    one, many = rates[("treadle", 1)], rates[("treadle", args.queues)]
    table(
        TITLE + ": drain",
        ["claim", "worker serves", "jobs/s", "x 1 queue", "worker CPU ms/job", "server CPU ms/job"],
        [[v, f"{q:,} queue{'s' if q > 1 else ''}", spread(rates[(v, q)], 0),
          paired_ratio(rates[(v, q)], rates[(v, 1)]) if q > 1 else "1.00", ms_per_job((v, q), 0),
          ms_per_job((v, q), 1)] for v in variants for q in cases],
        [f"{jobs:,} jobs per drain, spread evenly over the queues; one worker process, concurrency "
         f"{args.concurrency}, empty handlers; {runs_text(args.runs)}: median (range), the cases alternating run by "
         f"run. Goal: {args.queues} queues within 10% of 1 queue (measured x{paired_ratio(many, one)})."],
    )
    one: Case = (1, False)

    def cpu_text(side: str, case: Case) -> str:
        return spread(figures.get((side, case, 0), []), 0)

    def cpu_ratio(side: str, case: Case) -> str:
        values, base = figures.get((side, case, 0), []), figures.get((side, one, 0), [])
        return paired_ratio(values, base) if values and len(values) == len(base) else "-"

    def pct(side: str, case: Case, p: int) -> str:
        return spread(figures[(side, case, p)])

    def pct_ratio(side: str, case: Case, p: int) -> str:
        return paired_ratio(figures[(side, case, p)], figures[(side, one, p)])

    rows, pooler_rows, cpu_rows = [], [], []
    for case in claim_cases:
        if args.against:
            a50, a99 = figures[("against", case, 50)], figures[("against", case, 99)]
            a1 = figures[("against", one, 50)], figures[("against", one, 99)]
            progress(f"against, {case_text(case)} queues: p50 {spread(a50)} (x{paired_ratio(a50, a1[0])} "
                     f"1 queue), p99 {spread(a99)} (x{paired_ratio(a99, a1[1])}), server CPU "
                     f"us/claim {cpu_text('against', case)} (x{cpu_ratio('against', case)})")
        progress(f"treadle, {case_text(case)} queues: server CPU us/claim {cpu_text('treadle', case)}"
                 + (f", x{paired_ratio(figures[('treadle', case, 0)], figures[('against', case, 0)])} against"
                    if args.against and figures.get(("against", case, 0)) and figures.get(("treadle", case, 0))
                    else ""))
        rows.append([case_text(case)]
                    + [f(side, case, p) for side in ("worker", "treadle", "raw") for p in (50, 99)
                       for f in (pct, pct_ratio)]
                    + [paired_ratio(figures[("worker", case, 50)], figures[("raw", case, 50)])])
        pooler_rows.append([case_text(case)]
                           + [f(side, case, p) for side in ("pooler, list in text", "pooler, list as parameter")
                              for p in (50, 99) for f in (pct, pct_ratio)]
                           + [paired_ratio(figures[("pooler, list in text", case, 0)],
                                           figures[("pooler, list as parameter", case, 0)])])
        cpu_rows.append([case_text(case)] + [f"{cpu_text(side, case)}, x{cpu_ratio(side, case)}"
                                             for side in SIDES + (("against",) if args.against else ())])
    common = (f"One job per claim, names => ARRAY['bench'], each queue holding at least 2 waiting jobs (\"1 with "
              f"work\": only the first); {samples} claims per run, case and side, the cases and sides interleaved "
              f"sample by sample; {runs_text(args.runs)}: median (range) of the runs' percentiles, each ratio to "
              "its side's 1-queue case paired run by run.")
    table(
        TITLE + ": claim, milliseconds",
        ["queues named"]
        + [f"{side} {p}" for side in ("worker", "treadle", "raw") for p in ("p50", "x 1", "p99", "x 1")]
        + ["p50 worker / raw"],
        rows,
        [common + " Worker: the worker's own statement (its queues, names, id and lease written into its text), "
         "prepared. Treadle: treadle.claim with the list as a parameter, prepared. Raw: one SKIP LOCKED claim with "
         "queue = ANY(...) on a bare copy of the same rows. Goal: the claim's cost does not grow with the queues "
         "named."],
    )
    table(
        TITLE + ": claim through a pooler (unprepared), milliseconds",
        ["queues named"] + [f"{side} {p}" for side in ("list in text", "list as parameter")
                            for p in ("p50", "x 1", "p99", "x 1")] + ["server CPU, text / parameter"],
        pooler_rows,
        [common + " Both unprepared, as with prepared statements off: the worker's fixed arguments (queues, "
         "names, id, lease) written into the statement's text, against the same sent as bound parameters (what "
         "the worker sends there)."],
    )
    table(
        TITLE + ": claim, server CPU microseconds per claim",
        ["queues named"] + list(SIDES) + (["against"] if args.against else []),
        cpu_rows,
        ["The claiming backend's user + system time (/proc) over the run's claims, per claim (a 10 ms clock tick "
         "per run of a case), each with its ratio to its own 1-queue case, paired run by run; median (range)."],
    )


if __name__ == "__main__":
    main()
