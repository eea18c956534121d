"""The CHECK constraints of treadle.workflow_runs and treadle.jobs: their server CPU, this
tree's against another revision's, in one database.

PostgreSQL prepares a table's CHECK constraints again at each execution of a statement that
inserts or updates it (each stored expression is read back from its text and planned,
ExecRelCheck), whatever columns the statement writes, and every statement of a PL/pgSQL
function is an execution of its own. Before each side the CHECK constraints of
treadle.workflow_runs and treadle.jobs (and of bench_raw.jobs, the raw baseline's copy of
treadle.jobs) are replaced, on empty tables, by those that sql/src/010_tables.sql declares
at that side's revision; then, on that side:

  statement  --statements single-row UPDATEs in a PL/pgSQL loop, of run rows (the
             results column, as a completed step writes it) and of job rows: server
             CPU per statement.
  linear     bench/workflows.py's linear side: --linear-runs runs of a -> b -> c and three
             times as many plain jobs (one treadle.enqueue each), each started in one
             statement and drained on one connection (treadle.claim of 10, then
             treadle.complete_many): server CPU per job, and run / plain (issue 23).
  cycle      --jobs plain jobs drained on one connection by treadle.complete_and_claim
             (batch 10), and as many rows of bench_raw.jobs by the raw finish-and-claim
             statement (issue 25): server CPU per job, and treadle / raw.

--floor adds a side with no CHECK constraint on either table. The sides take turns in each
round (the order rotating); figures are medians (range) over the rounds of the backends'
CPU (/proc/PID/schedstat), and ratios are taken round by round.

    .build/venv/bin/python bench/check_cost.py [--runs 5] [--before main] [--floor]
                                               [--statements 2000] [--linear-runs 2000] [--jobs 20000]
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    ROOT,
    database,
    median,
    paired_ratio,
    parser,
    print_settings,
    progress,
    raw_finish_and_claim,
    server,
    spread,
    table,
)
from harness import cpu_seconds as harness_cpu_seconds
from workflows import drain_all, linear_side

TITLE = "The CHECK constraints of workflow_runs and jobs: server CPU, this tree against another revision"
TABLES = ("workflow_runs", "jobs")
RUN_UPDATES = """
CREATE FUNCTION pg_temp.run_updates(n integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    FOR v_id IN SELECT r.id FROM treadle.workflow_runs AS r ORDER BY r.id LIMIT n LOOP
        UPDATE treadle.workflow_runs AS r SET results = r.results || jsonb_build_object('a', v_id)
         WHERE r.queue = 'checks' AND r.id = v_id AND r.state = 'running';
    END LOOP;
END;
$$
"""
JOB_UPDATES = """
CREATE FUNCTION pg_temp.job_updates(n integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    FOR v_id IN SELECT j.id FROM treadle.jobs AS j ORDER BY j.id LIMIT n LOOP
        UPDATE treadle.jobs AS j SET run_at = j.run_at + interval '1 second'
         WHERE j.queue = 'checks' AND j.id = v_id;
    END LOOP;
END;
$$
"""


def checks(source: str, name: str) -> list[tuple[str, str]]:
    """The CHECK constraints (name, CHECK (...)) that CREATE TABLE treadle.<name> declares in `source`."""
    m = re.search(rf"^CREATE TABLE treadle\.{name} \((.*?)^\);", source, re.S | re.M)
    assert m, f"no CREATE TABLE treadle.{name}"
    body, found = m.group(1), []
    for c in re.finditer(r"CONSTRAINT (\w+)\s+CHECK\s*\(", body):
        depth, i = 1, c.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(body[i], 0)
            i += 1
        found.append((c.group(1), "CHECK " + body[c.end() - 1 : i]))
    return found


def constraint_sets(rev: str) -> dict[str, list[tuple[str, str]]]:
    """Table -> its CHECK constraints at `rev` ('.': this tree)."""
    path = "sql/src/010_tables.sql"
    if rev == ".":
        source = (ROOT / path).read_text()
    else:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True,
                                capture_output=True, text=True).stdout  # fmt: skip
    return {t: checks(source, t) for t in TABLES}


def put_checks(conn: psycopg.Connection[Any], sets: dict[str, list[tuple[str, str]]], tables: tuple[str, ...]) -> None:
    """Give each of `tables` (schema-qualified; empty, or each row is checked) in place of its
    CHECK constraints those `sets` holds for its name (bench_raw.jobs: those of jobs)."""
    with conn.transaction():
        for table_ in tables:
            for (old,) in conn.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'", (table_,)
            ).fetchall():
                conn.execute(f"ALTER TABLE {table_} DROP CONSTRAINT {old}")
            for name, definition in sets[table_.rpartition(".")[2]]:
                conn.execute(f"ALTER TABLE {table_} ADD CONSTRAINT {name} {definition}")


def apply(conn: psycopg.Connection[Any], sets: dict[str, list[tuple[str, str]]]) -> None:
    """Empty the tables and give them these CHECK constraints (bench_raw.jobs those of jobs)."""
    conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs, bench_raw.jobs CASCADE")
    put_checks(conn, sets, ("treadle.workflow_runs", "treadle.jobs", "bench_raw.jobs"))


def cpu_seconds(pid: int) -> float:
    """The CPU time a process on this machine has used, in nanoseconds' resolution where the
    kernel keeps schedstat."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return harness_cpu_seconds(pid) or float("nan")


def statements(db: str, n: int) -> tuple[float, float]:
    """Server CPU µs per single-row UPDATE of a run row, and of a job row (rolled back)."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs CASCADE")
        conn.execute("SELECT count(treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b', 'c'],"
                     " queue => 'checks')) FROM generate_series(1, %s)", (n,))  # fmt: skip
        conn.execute("VACUUM ANALYZE treadle.workflow_runs, treadle.jobs")
        conn.execute(RUN_UPDATES)
        conn.execute(JOB_UPDATES)
        pid, out = conn.info.backend_pid, []
        for fn in ("run_updates", "job_updates"):
            with conn.transaction(force_rollback=True):
                conn.execute(f"SELECT pg_temp.{fn}(100)")  # warm: the function compiled, the plans made
            with conn.transaction(force_rollback=True):
                began = cpu_seconds(pid)
                conn.execute(f"SELECT pg_temp.{fn}(%s)", (n,))
                out.append((cpu_seconds(pid) - began) * 1e6 / n)
    return out[0], out[1]


def cycle(db: str, jobs: int, kind: str) -> float:
    """Server CPU µs per job: `jobs` plain jobs drained by complete_and_claim (treadle), or
    bench_raw.jobs rows by the raw finish-and-claim statement (raw), batch 10."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs, bench_raw.jobs CASCADE")
        if kind == "treadle":
            conn.execute("SELECT count(*) FROM treadle.enqueue_many("
                         " (SELECT jsonb_agg(jsonb_build_object('name', 'plain', 'queue', 'checks'))"
                         "    FROM generate_series(1, %s)))", (jobs,))  # fmt: skip
            conn.execute("VACUUM ANALYZE treadle.jobs")
            drained: float = drain_all(db, "checks", ["plain"], jobs, 10, 1, how="cycle")[1]
            return drained * 1e6 / jobs
        conn.execute("INSERT INTO bench_raw.jobs (queue, name, args, run_at, created_at)"
                     " SELECT 'checks', 'plain', '{}', now(), now() FROM generate_series(1, %s)", (jobs,))  # fmt: skip
        conn.execute("VACUUM ANALYZE bench_raw.jobs")
        statement, done = raw_finish_and_claim(10), 0
        ids: list[int] = []
        began = cpu_seconds(conn.info.backend_pid)
        while True:
            rows = conn.execute(statement, {"ids": ids, "queue": "checks", "name": "plain", "lease": "30 seconds",
                                            "worker_id": "bench"}).fetchall()  # fmt: skip
            done += len(ids)
            ids = [r[0] for r in rows]
            if not ids:
                break
        assert done == jobs, f"{done} of {jobs} raw jobs finished"
        return (cpu_seconds(conn.info.backend_pid) - began) * 1e6 / jobs


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--before", default="main", help="the revision to compare with (default main; '.': this tree)")
    p.add_argument("--floor", action="store_true", help="a third side: no CHECK constraint on either table")
    p.add_argument("--statements", type=int, default=2000)
    p.add_argument("--linear-runs", type=int, default=2000)
    p.add_argument("--jobs", type=int, default=20000)
    args = p.parse_args()
    if args.smoke:
        args.statements, args.linear_runs, args.jobs, args.before = 50, 20, 100, "."
    sets = {"before": constraint_sets(args.before), "this": constraint_sets(".")}
    if args.floor:
        sets["none"] = {t: [] for t in TABLES}
    sides = list(sets)
    keys = ("run_update", "job_update", "linear_run", "linear_plain", "cycle", "raw")
    got: dict[str, dict[str, list[float]]] = {s: {k: [] for k in keys} for s in sides}
    with server() as url:
        print_settings(url)
        with database(url, "check_cost") as db:
            try:
                for r in range(args.runs):
                    for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                        progress(f"round {r + 1}/{args.runs}: {side}")
                        with psycopg.connect(db, autocommit=True) as conn:
                            apply(conn, sets[side])
                        g = got[side]
                        run_update, job_update = statements(db, args.statements)
                        g["run_update"].append(run_update)
                        g["job_update"].append(job_update)
                        for kind in ("run", "plain"):
                            cpu = linear_side(db, kind, args.linear_runs, 10, f"lin-{r}-{side}")[1]
                            g[f"linear_{kind}"].append(cpu * 1e6 / (3 * args.linear_runs))
                        g["cycle"].append(cycle(db, args.jobs, "treadle"))
                        g["raw"].append(cycle(db, args.jobs, "raw"))
            finally:
                with psycopg.connect(db, autocommit=True) as conn:
                    apply(conn, sets["this"])

    def row(label: str, key: str) -> list[str]:
        return [label] + [spread(got[s][key], 1) for s in sides] + [paired_ratio(got["this"][key], got["before"][key])]

    def ratio_row(label: str, top: str, bottom: str) -> list[str]:
        return [label] + [paired_ratio(got[s][top], got[s][bottom]) for s in sides] + ["-"]

    counts = {s: "/".join(str(len(sets[s][t])) for t in TABLES) for s in sides}
    table(
        f"{TITLE} (median (range) of {args.runs} rounds; before = {args.before})",
        ["server CPU, µs", *(f"{s} ({counts[s]} checks)" for s in sides), "this / before"],
        [
            row("UPDATE of a run row, per statement", "run_update"),
            row("UPDATE of a job row, per statement", "job_update"),
            row(f"linear: {args.linear_runs} runs of 3 steps, per job", "linear_run"),
            row("linear: plain jobs, per job", "linear_plain"),
            ratio_row("linear: run / plain (issue 23: <= 1.2)", "linear_run", "linear_plain"),
            row(f"complete_and_claim: {args.jobs} plain jobs, batch 10, per job", "cycle"),
            row("raw finish-and-claim, per job", "raw"),
            ratio_row("complete_and_claim / raw (issue 25: server within 1.3x)", "cycle", "raw"),
        ],
        [
            "checks: CHECK constraints of workflow_runs/jobs; median of each figure over the rounds: "
            + ", ".join(f"{s} {median(got[s]['linear_run']):.0f}" for s in sides)
            + " µs per job of a linear run"
        ],
    )


if __name__ == "__main__":
    main()
