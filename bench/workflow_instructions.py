"""A linear run against three plain jobs, counted in server instructions and WAL bytes.

Seconds of CPU move with the machine's load; instructions do not. This script starts a
throwaway cluster (scripts/pgcluster), makes a database per side and size from one with
treadle installed, stops the server, and runs each side in a single-user backend under
valgrind's callgrind: --linear-runs runs of a -> b -> c started in one statement
(treadle.start_workflow), or three times as many plain jobs (treadle.enqueue), then
`ANALYZE`, then a claim of 10 by the steps' job names and a complete_many of them, one
transaction a batch, until none is left (bench/workflows.py's linear side, each batch's
two statements made one). Every side runs at two sizes; the difference between them is a
side's cost for its extra jobs, free of the backend's start and first calls. Both sizes
must be large enough for the plans a server runs at work: at 500 runs and fewer the
planner reads treadle.workflow_runs (a few pages) by sequential scans where it looks up a
batch's runs, so each batch's cost grows with the table, and the difference between two
small sizes counts that growth as a cost per job (x1.32 at 50 against 150 runs, where
1,000 against 3,000 gives x1.16; 500 against 1,500, its smaller size still scanned, x1.13). With
--before REV, a third side runs the linear run with the advance path's functions of REV
(bench/workflow_cost.py's FILES); with --checks REV, two more sides run both kinds with the
CHECK constraints of treadle.jobs and treadle.workflow_runs that REV's
sql/src/010_tables.sql declares (bench/check_cost.py's). One run of each: the counts repeat
to within about 1% (a side's count has moved by 1.4% between two clusters).

Figures per job: server instructions (callgrind's total), WAL bytes
(pg_current_wal_insert_lsn before and after), and each side's ratio to the plain jobs.

    .build/venv/bin/python bench/workflow_instructions.py [--linear-runs 3000] [--before REV] [--checks REV]

Needs valgrind (--smoke runs without it and counts WAL bytes only); as root it runs the
server as the postgres user (as scripts/pgcluster).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import psycopg
from check_cost import constraint_sets, put_checks
from harness import ROOT, fmt, parser, progress, table
from workflow_cost import sources

TITLE = "A linear run against three plain jobs: server instructions and WAL bytes per job"
PG_CONFIG = os.environ.get("PG_CONFIG", "pg_config")
DRAIN_BATCH = """
CREATE FUNCTION public.bench_batch(names text[]) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_ids    bigint[];
    v_tokens uuid[];
BEGIN
    SELECT array_agg(c.id), array_agg(c.lease_token) INTO v_ids, v_tokens
      FROM treadle.claim('bench', ARRAY['q'], names => names, batch => 10) AS c;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM count(*) FROM treadle.complete_many(v_ids, v_tokens);
    RETURN cardinality(v_ids);
END;
$$
"""
LINEAR_NAMES = "ARRAY['workflow:lin/a', 'workflow:lin/b', 'workflow:lin/c']"
LSN = re.compile(r'pg_current_wal_insert_lsn = "([0-9A-F]+)/([0-9A-F]+)"')


def as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def script(side: str, runs: int) -> str:
    """The statements of one side, a line each (each line its own transaction)."""
    if side == "plain":
        start = f"SELECT count(treadle.enqueue('plain', '{{}}', queue => 'q')) FROM generate_series(1, {3 * runs})"
        names = "ARRAY['plain']"
    else:
        start = (
            "SELECT count(treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'q'))"
            f" FROM generate_series(1, {runs})"
        )
        names = LINEAR_NAMES
    lines = ["SELECT pg_current_wal_insert_lsn()", start, "ANALYZE treadle.jobs", "ANALYZE treadle.workflow_runs"]
    lines += [f"SELECT public.bench_batch({names})"] * (3 * runs // 10 + 3)
    lines += ["SELECT pg_current_wal_insert_lsn()"]
    return "\n".join(lines) + "\n"


def measure(folder: Path, dbname: str, text: str, count: bool) -> tuple[int, int]:
    """Instructions (0 when not `count`ed: no valgrind) and WAL bytes of one single-user backend running `text`."""
    bindir = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
    out = folder / f"callgrind.{dbname}"
    command = [f"{bindir}/postgres", "--single", "-D", str(folder / "data"), "-c", "full_page_writes=on", dbname]
    if count:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command]
    done = subprocess.run(as_owner(command), input=text, capture_output=True, text=True, check=False)
    lsns = [int(hi, 16) << 32 | int(lo, 16) for hi, lo in LSN.findall(done.stdout)]
    if "ERROR" in done.stdout or len(lsns) != 2:
        raise RuntimeError(f"{dbname}: {done.stdout[-2000:]}")
    if not count:
        return 0, lsns[1] - lsns[0]
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    assert totals is not None, f"no total in {out}"
    return int(totals.group(1)), lsns[1] - lsns[0]


def main() -> None:
    p = parser(TITLE)  # (--runs is taken and unused: the counts repeat to within about 1%)
    p.add_argument("--linear-runs", type=int, default=3000, help="runs at the larger size; the smaller is a third")
    p.add_argument("--before", help="also the linear run with the advance path of this revision")
    p.add_argument("--checks", help="also both kinds with this revision's CHECK constraints")
    args = p.parse_args()
    if not args.smoke and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    large = 30 if args.smoke else args.linear_runs
    sizes = (large // 3, large)
    sides = ["linear", "plain"] + ([f"linear at {args.before}"] if args.before else [])
    if args.checks:
        sides += [f"linear, checks of {args.checks}", f"plain, checks of {args.checks}"]
    folder = ROOT / ".build" / "bench-cluster" / f"workflow_instructions-{os.getpid()}"
    pgcluster = str(ROOT / "scripts" / "pgcluster")
    progress(f"starting a throwaway cluster in {folder}")
    url = subprocess.run([pgcluster, "start", str(folder)], check=True, capture_output=True, text=True).stdout.strip()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for k, side in enumerate(sides):
                conn.execute(f"CREATE DATABASE bench_side_{k}")
                with psycopg.connect(url.rsplit("/", 1)[0] + f"/bench_side_{k}", autocommit=True) as side_conn:
                    side_conn.execute("CREATE EXTENSION treadle")
                    if side.startswith("linear at "):
                        side_conn.execute(sources(args.before))
                    if ", checks of " in side:
                        put_checks(side_conn, constraint_sets(args.checks), ("treadle.jobs", "treadle.workflow_runs"))
                    side_conn.execute(DRAIN_BATCH)
                for n in sizes:
                    conn.execute(f"CREATE DATABASE bench_side_{k}_{n} TEMPLATE bench_side_{k}")
            server_version = conn.execute("SHOW server_version").fetchone()
        subprocess.run([pgcluster, "stop", str(folder)], check=True, capture_output=True)
        counts: dict[str, tuple[float, float]] = {}
        for k, side in enumerate(sides):
            kind = "plain" if side.startswith("plain") else "linear"
            got = []
            for n in sizes:
                progress(f"{side}: {n} runs' worth under callgrind")
                got.append(measure(folder, f"bench_side_{k}_{n}", script(kind, n), count=not args.smoke))
            jobs = 3 * (sizes[1] - sizes[0])
            counts[side] = ((got[1][0] - got[0][0]) / jobs, (got[1][1] - got[0][1]) / jobs)
    finally:
        subprocess.run([pgcluster, "stop", str(folder)], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
    plain = counts["plain"]
    rows = [
        [
            side,
            f"{counts[side][0]:,.0f}",
            fmt(counts[side][0] / plain[0]) if plain[0] else "-",
            f"{counts[side][1]:,.0f}",
            fmt(counts[side][1] / plain[1]),
        ]
        for side in sides
    ]
    version = server_version[0] if server_version else "?"
    table(
        TITLE + f" ({sizes[1]} against {sizes[0]} runs' worth; PostgreSQL {version})",
        ["side", "instructions per job", "/ plain", "WAL bytes per job", "/ plain"],
        rows,
    )


if __name__ == "__main__":
    main()
