"""The worker's cycle for plain jobs: complete_and_claim's backend CPU per job, this tree
against another revision, beside the raw one-statement cycle.

Three sides on one server, each draining --jobs plain jobs (no workflow, no key, no tenant,
no periodic or scheduled job) on one connection, finishing the last batch and claiming the
next in one statement, batch 10:

  before  treadle.complete_and_claim in a database with another revision's plain install
          (--before REV, built from `git archive`; by default the commit before
          bench/cycle_cost.py's first)
  now     the same call on this tree's plain install (--now REV: that revision's)
  raw     harness.RAW_FINISH_AND_CLAIM on bench_raw.jobs (in the `now` database)

The call is the worker's (_sql.COMPLETE_AND_CLAIM's arguments): results null, job_queues
given, a lease_token, names of one job name. The sides take turns (the first side changes
every round); each figure is the median over the rounds of the backend's CPU time over
the drain (/proc/PID/schedstat), per job; the ratios are taken round by round.
--profile drains once more on each treadle side with pg_stat_statements tracking nested
statements, and prints each statement's calls and time per cycle.

    .build/venv/bin/python bench/cycle_cost.py [--runs 7] [--before REV] [--now REV] [--jobs 5000] [--profile]
"""

from __future__ import annotations

import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    RAW_SCHEMA,
    ROOT,
    fmt,
    median,
    parser,
    print_settings,
    progress,
    raw_finish_and_claim,
    server,
    spread,
    table,
)
from nokeys import databases, plain_script
from psycopg.types.json import Jsonb
from rescue_cost import cpu_seconds

TITLE = "complete_and_claim's backend CPU per plain job, this tree against another revision and raw"
SIDES = ("before", "now", "raw")
BATCH = 10
CHUNK = 1000
CYCLE = """
SELECT (c.job).id, (c.job).lease_token
  FROM treadle.complete_and_claim(job_ids => %(ids)s::bigint[], lease_tokens => %(tokens)s::uuid[],
                                  results => NULL::jsonb[], worker_id => 'cycle', queues => ARRAY['default'],
                                  names => ARRAY['bench'], batch => 10, lease => '30 seconds'::interval,
                                  lease_token => %(token)s::uuid, job_queues => %(queues)s::text[]) AS c
 WHERE c.finished_id IS NULL
"""


def first_commit_parent() -> str:
    """The commit before the first one of this script (this tree's HEAD while it has none)."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--format=%H", "--", "bench/cycle_cost.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    rev = out[-1] + "^" if out else "HEAD"
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", rev], check=True, capture_output=True, text=True
    ).stdout.strip()


def fill(conn: psycopg.Connection[Any], table_name: str, jobs: int) -> None:
    if table_name == "treadle.jobs":
        conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs CASCADE")
        for start in range(0, jobs, CHUNK):
            conn.execute(
                "SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb([{"name": "bench"}] * min(CHUNK, jobs - start))]
            )
    else:
        conn.execute("TRUNCATE bench_raw.jobs")
        conn.execute(
            "INSERT INTO bench_raw.jobs (queue, name, args, run_at, created_at) "
            "SELECT 'default', 'bench', '{}', now(), now() FROM generate_series(1, %s)",
            [jobs],
        )
    conn.execute(f"VACUUM ANALYZE {table_name}")


def drain(conn: psycopg.Connection[Any], side: str, jobs: int) -> float:
    """Backend CPU ms per job over one drain of `jobs` jobs."""
    fill(conn, "bench_raw.jobs" if side == "raw" else "treadle.jobs", jobs)
    cur = conn.cursor()
    ids: list[int] = []
    tokens: list[str] = []
    done = 0
    raw = raw_finish_and_claim(BATCH)
    pid = conn.info.backend_pid
    start = cpu_seconds(pid)
    while True:
        if side == "raw":
            cur.execute(
                raw,  # type: ignore[arg-type]  # a constant of harness.py, formatted with an integer
                {"ids": ids, "queue": "default", "name": "bench", "lease": "30 seconds", "worker_id": "cycle"},
                prepare=True,
            )
            rows = [(r[0], r[0]) for r in cur.fetchall()]
        else:
            cur.execute(
                CYCLE,
                {"ids": ids, "tokens": tokens, "token": uuid.uuid4(), "queues": ["default"] * len(ids)},
                prepare=True,
            )
            rows = cur.fetchall()
        done += len(ids)
        if not rows:
            break
        ids, tokens = [r[0] for r in rows], [str(r[1]) for r in rows]
    end = cpu_seconds(pid)
    assert start is not None and end is not None
    table_name = "bench_raw.jobs" if side == "raw" else "treadle.jobs"
    row = conn.execute(f"SELECT count(*) FROM {table_name} WHERE state = 'completed'").fetchone()
    assert row is not None and row[0] == jobs == done, (side, row, jobs, done)
    return (end - start) * 1000 / jobs


def profile(url: str, jobs: int) -> list[list[str]]:
    """Each statement's calls, plans and us per cycle over one drain (pg_stat_statements, nested ones too)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET pg_stat_statements.track = 'all'")
        conn.execute("SET pg_stat_statements.track_planning = on")
        drain(conn, "now", jobs)  # plans and caches warmed
        conn.execute("SELECT pg_stat_statements_reset()")
        drain(conn, "now", jobs)
        cycles = jobs / BATCH
        got = conn.execute(
            "SELECT calls, plans, total_exec_time + total_plan_time, "
            "       regexp_replace(left(query, 110), '\\s+', ' ', 'g') "
            "  FROM pg_stat_statements "
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "   AND query NOT LIKE '%%pg_stat_statements%%' "
            " ORDER BY total_exec_time DESC LIMIT 25"
        ).fetchall()
    return [
        [fmt(c / cycles, 2), fmt(n / cycles, 2), fmt(t * 1000 / cycles, 1), q.replace("|", "\\|")] for c, n, t, q in got
    ]


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument(
        "--before", metavar="REV", help="the other revision (default: the commit before this script's first)"
    )
    p.add_argument("--now", metavar="REV", default=".", help="the revision measured (default '.', this tree)")
    p.add_argument("--jobs", type=int, default=5000, help="jobs per drain (default 5,000)")
    p.add_argument("--profile", action="store_true", help="also each statement's calls and time per cycle")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs must be at least 1")
    jobs = 300 if args.smoke else args.jobs
    before = args.before or first_commit_parent()
    out: dict[str, list[float]] = {s: [] for s in SIDES}
    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    profiles: dict[str, list[list[str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        progress(f"building the plain scripts of {before} and of {args.now}")
        scripts = {}
        for side, rev in (("before", before), ("now", args.now)):
            (Path(tmp) / side).mkdir()
            scripts[side] = plain_script(rev, Path(tmp) / side)
        with server(settings) as url, databases(url, scripts) as urls:
            print_settings(urls["now"])
            with psycopg.connect(urls["now"], autocommit=True) as conn:
                conn.execute(RAW_SCHEMA)
            conns = {
                "before": psycopg.connect(urls["before"], autocommit=True),
                "now": psycopg.connect(urls["now"], autocommit=True),
                "raw": psycopg.connect(urls["now"], autocommit=True),
            }
            try:
                for side in SIDES:  # a drain each first: plans cached, tables warm
                    drain(conns[side], side, min(jobs, 1000))
                for run in range(args.runs):
                    order = SIDES[run % 3 :] + SIDES[: run % 3]
                    if run % 2:
                        order = order[::-1]
                    for side in order:
                        out[side].append(drain(conns[side], side, jobs))
                    progress(f"run {run + 1}/{args.runs}: " + ", ".join(f"{s} {out[s][-1]:.4f} ms/job" for s in SIDES))
            finally:
                for conn in conns.values():
                    conn.close()
            if args.profile:
                for side in ("before", "now"):
                    progress(f"profile: {side}")
                    profiles[side] = profile(urls[side], jobs)

    def ratios(a: str, b: str) -> str:
        return spread([x / y for x, y in zip(out[a], out[b], strict=True) if y], 3)

    table(
        TITLE,
        ["side", "backend CPU ms per job", "ratio to raw", "ratio to before"],
        [
            [f"before ({before})", spread(out["before"], 4), ratios("before", "raw"), "1"],
            [
                "now" if args.now == "." else f"now ({args.now})",
                spread(out["now"], 4),
                ratios("now", "raw"),
                ratios("now", "before"),
            ],
            ["raw", spread(out["raw"], 4), "1", "-"],
        ],
        notes=[
            f"{args.runs} rounds of a {jobs:,}-job drain per side, batch {BATCH}, one connection per side, "
            "the sides in turn; median (range) over the rounds, ratios round by round. "
            f"Medians: now - before = {median(out['now']) - median(out['before']):+.4f} ms per job."
        ],
    )
    for side, rows in profiles.items():
        title = f"Statements per cycle, {side} (pg_stat_statements, track = all)"
        table(title, ["calls", "plans", "us", "statement"], rows)


if __name__ == "__main__":
    main()
