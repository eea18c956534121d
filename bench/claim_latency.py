"""Scenario 2, claim latency: p50 and p99 of claiming one job, as a worker does it.

Each sample is one autocommit `treadle.claim(..., names => ARRAY['bench'], batch => 1)`
timed at the client, interleaved one for one with the raw baseline: the same
SKIP LOCKED claim written by hand against bench_raw.jobs, holding the same rows.

    .build/venv/bin/python bench/claim_latency.py [--rows 1000000] [--samples 500] [--runs 3]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from harness import (
    TREADLE_CLAIM,
    Stopwatch,
    database,
    fmt,
    median,
    paired_ratio,
    parser,
    percentile,
    print_settings,
    progress,
    ratio,
    raw_claim,
    reset_tables,
    runs_text,
    server,
    spread,
    table,
)

TITLE = "Claim latency: one job per claim, milliseconds"
CLAIM_PARAMS = {"worker_id": "bench", "queue": "default", "names": ["bench"], "name": "bench", "batch": 1,
                "lease": "30 seconds"}
WARMUP = 20

# One statement fills both tables with the same rows: finished ones first (oldest),
# then jobs nobody handles, then the jobs the claimer handles (newest).
FILL = """
INSERT INTO {table} (queue, name, args, state, run_at, attempt, worker_id, created_at, started_at, finished_at)
SELECT 'default', f.name, jsonb_build_object('i', g), f.state,
       now() - interval '1 hour' + g * interval '1 millisecond', f.attempt, f.worker_id,
       now() - interval '1 hour', f.started_at, f.finished_at
  FROM generate_series(1, %(finished)s + %(unhandled)s + %(waiting)s) AS g
 CROSS JOIN LATERAL (
       SELECT CASE WHEN g > %(finished)s AND g <= %(finished)s + %(unhandled)s THEN 'unhandled' ELSE 'bench' END
              AS name,
              CASE WHEN g <= %(finished)s THEN 'completed' ELSE 'available' END AS state,
              CASE WHEN g <= %(finished)s THEN 1 ELSE 0 END AS attempt,
              CASE WHEN g <= %(finished)s THEN 'bench' END AS worker_id,
              CASE WHEN g <= %(finished)s THEN now() END AS started_at,
              CASE WHEN g <= %(finished)s THEN now() END AS finished_at) AS f
"""
# Put claimed jobs back between runs, so that every run starts from the same rows. A
# writer that makes a job claimable again sets ready_txid, as treadle's own do: claims
# resume from a cursor and look for such rows by it (sql/src/040_claim.sql).
UNCLAIM = """
UPDATE {table} SET state = 'available', attempt = 0, lease_until = NULL, lease_token = NULL,
                   worker_id = NULL, started_at = NULL, ready_txid = pg_current_xact_id()
 WHERE state = 'running'
"""
TABLES = ("treadle.jobs", "bench_raw.jobs")


@dataclass
class Case:
    label: str
    waiting: int
    finished: int = 0
    unhandled: int = 0


def fill(conn: psycopg.Connection[Any], case: Case) -> None:
    reset_tables(conn)
    sizes = {"waiting": case.waiting, "finished": case.finished, "unhandled": case.unhandled}
    for name in TABLES:
        conn.execute(FILL.format(table=name), sizes)
        conn.execute(f"VACUUM ANALYZE {name}")


def unclaim(conn: psycopg.Connection[Any]) -> None:
    for name in TABLES:
        conn.execute(UNCLAIM.format(table=name))
        conn.execute(f"VACUUM ANALYZE {name}")


def sampler(conn: psycopg.Connection[Any], query: str) -> Callable[[], float]:
    """A function that claims one job and returns the milliseconds it took."""
    cur = conn.cursor()

    def claim() -> float:
        with Stopwatch() as s:
            cur.execute(query, CLAIM_PARAMS, prepare=True)
            rows = cur.fetchall()
        if len(rows) != 1:
            raise RuntimeError(f"a claim returned {len(rows)} jobs, expected 1")
        return s.ms

    return claim


def measure(url: str, case: Case, samples: int, runs: int) -> dict[str, list[float]]:
    """Per run: p50 and p99 of each side, samples interleaved one for one."""
    figures: dict[str, list[float]] = {k: [] for k in ("t50", "t99", "r50", "r99")}
    with psycopg.connect(url, autocommit=True) as admin, \
            psycopg.connect(url, autocommit=True) as tconn, psycopg.connect(url, autocommit=True) as rconn:
        progress(f"{case.label}: filling both tables")
        fill(admin, case)
        claim_treadle, claim_raw = sampler(tconn, TREADLE_CLAIM), sampler(rconn, raw_claim(1))
        for run in range(runs):
            progress(f"{case.label}: run {run + 1}/{runs}, {samples} samples each")
            for _ in range(WARMUP):
                claim_treadle(), claim_raw()
            t: list[float] = []
            r: list[float] = []
            for i in range(samples):
                # alternate which side goes first, so neither always follows the other's commit
                if i % 2:
                    t.append(claim_treadle())
                    r.append(claim_raw())
                else:
                    r.append(claim_raw())
                    t.append(claim_treadle())
            for key, values in (("t", t), ("r", r)):
                figures[f"{key}50"].append(percentile(values, 50))
                figures[f"{key}99"].append(percentile(values, 99))
            unclaim(admin)
    return figures


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows in the large cases (default 1,000,000)")
    p.add_argument("--samples", type=int, default=500, help="claims timed per run and side (default 500)")
    args = p.parse_args()
    big, small, backlog, waiting, samples = args.rows, 10_000, 100_000, 1_000, args.samples
    if args.smoke:
        big, small, backlog, waiting, samples = 3_000, 300, 1_000, 100, 30
    if samples + WARMUP > waiting:
        p.error(f"--samples must be at most {waiting - WARMUP}: each claim takes one of the {waiting} waiting jobs")

    cases = [
        Case(f"{small:,} rows, all waiting", waiting=small),
        Case(f"{big:,} rows, {big - waiting:,} finished", waiting=waiting, finished=big - waiting),
        Case(f"{big:,} rows, all waiting", waiting=big),
        Case(f"{backlog:,} unhandled ahead of {small:,} handled", waiting=small, unhandled=backlog),
    ]
    with server() as url, database(url, "claim") as db:
        print_settings(db)
        results = [(case, measure(db, case, samples, args.runs)) for case in cases]

    rows = []
    for case, f in results:
        rows.append([case.label, spread(f["t50"]), spread(f["r50"]), paired_ratio(f["t50"], f["r50"]),
                     spread(f["t99"]), spread(f["r99"]), paired_ratio(f["t99"], f["r99"])])
    plain, slow = results[0][1], results[3][1]
    table(
        TITLE,
        ["case", "treadle p50", "raw p50", "ratio", "treadle p99", "raw p99", "ratio"],
        rows,
        notes=[
            f"{samples} claims per run and side, {runs_text(args.runs)}: median (range) of the runs' percentiles. "
            "Raw: the same SKIP LOCKED claim by hand on a bare copy of the table.",
            "Unhandled backlog against the plain case (treadle): "
            f"p50 x{ratio(median(slow['t50']), median(plain['t50']))}, "
            f"p99 x{ratio(median(slow['t99']), median(plain['t99']))}. "
            f"Goal at {big:,} rows with {big - waiting:,} finished: p50 <= 1 ms, p99 <= 3 ms "
            f"(measured {fmt(median(results[1][1]['t50']))} / {fmt(median(results[1][1]['t99']))}).",
        ],
    )


if __name__ == "__main__":
    main()
