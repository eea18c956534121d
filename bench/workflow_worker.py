"""A linear workflow run through a worker process, against plain jobs through the same worker.

bench/workflows.py and bench/workflow_cost.py drain runs with a SQL loop; a user's runs go
through treadle.Worker, which also reads each claimed step's run (its input and the results
it receives) and hands it to the step. Here one worker process (bench/worker_treadle.py,
concurrency 10, empty handlers, its default options) drains --runs-per-side runs of three
steps (a -> b -> c, started by one statement of treadle.start_workflow calls), and, in
turns with it, as many plain jobs of three names (one treadle.enqueue each, one statement)
through a worker of three handlers. Figures per job: the wall time from the start statement
to the last completion, the CPU of the worker's server backends and of the start statement's
(/proc/PID/stat), and the worker process's CPU; ratios round by round (goal for a run: at
most 1.2x three plain jobs). --profile drains once more on each side with pg_stat_statements
tracking nested statements too (a throwaway server only): each statement's execution time per
job, where the sides differ.

    .build/venv/bin/python bench/workflow_worker.py [--runs 5] [--runs-per-side 3000] [--profile]
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import psycopg
from harness import (
    BENCH,
    PYTHON,
    cpu_seconds,
    database,
    fmt,
    paired_ratio,
    parser,
    print_settings,
    progress,
    server,
    spread,
    table,
)
from psycopg import sql
from workflows import PLAIN3_NAMES, reset

TITLE = "A linear run through a worker process, against plain jobs of three names"
WORKER = {
    "run": ["--workflow", "lin:a,b,c", "--names", ""],
    "plain": ["--names", ",".join(PLAIN3_NAMES)],
}
START = {
    "run": "SELECT count(treadle.start_workflow('lin', '{}', queue => 'wf')) FROM generate_series(1, %(n)s)",
    "plain": "SELECT count(treadle.enqueue(n.n, '{}', queue => 'wf')) FROM generate_series(1, %(n)s) AS g"
             " CROSS JOIN unnest(%(names)s::text[]) AS n(n)",
}  # fmt: skip


def backends(conn: psycopg.Connection[Any]) -> list[int]:
    """The other client backends of the server: the worker's, once it is ready."""
    return [
        pid
        for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
    ]


def cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def one_side(url: str, side: str, runs: int, clear: bool = True) -> tuple[float, float, float]:
    """Seconds, server CPU seconds and worker CPU seconds to start and drain `runs` runs (3 x runs jobs),
    on tables emptied first (here, unless `clear` is false: the caller did)."""
    if clear:
        reset(url)
    worker = subprocess.Popen([PYTHON, str(BENCH / "worker_treadle.py"), url, "--queue", "wf", *WORKER[side]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        with psycopg.connect(url, autocommit=True) as conn:
            pids = backends(conn)
            own = conn.info.backend_pid
            began, server_began, worker_began = time.perf_counter(), cpu(pids), cpu_seconds(worker.pid) or 0.0
            start_cpu = cpu_seconds(own) or 0.0
            conn.execute(START[side], {"n": runs, "names": PLAIN3_NAMES})
            start_cpu = (cpu_seconds(own) or 0.0) - start_cpu
            while conn.execute("SELECT count(*) FROM treadle.jobs WHERE state <> 'completed'").fetchone() != (0,):
                time.sleep(0.02)
            seconds = time.perf_counter() - began
            server = cpu(pids) - server_began + start_cpu
            worker_cpu = (cpu_seconds(worker.pid) or 0.0) - worker_began
            if side == "run":
                left = conn.execute("SELECT count(*) FROM treadle.workflow_runs WHERE state <> 'completed'").fetchone()
                assert left == (0,), f"{left} runs not completed"
    finally:
        if worker.stdin is not None:
            worker.stdin.close()
        worker.wait(timeout=60)
    return seconds, server, worker_cpu


def profile(url: str, side: str, runs: int) -> list[list[str]]:
    """Each statement's calls and execution time per job over one more drain (pg_stat_statements,
    nested statements too, and so counted in their callers as well)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute(sql.SQL("ALTER DATABASE {} SET pg_stat_statements.track = 'all'").format(
            sql.Identifier(conn.info.dbname)))  # fmt: skip
    reset(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
    one_side(url, side, runs, clear=False)
    with psycopg.connect(url, autocommit=True) as conn:
        got = conn.execute(
            "SELECT calls, total_exec_time, regexp_replace(left(query, 120), '\\s+', ' ', 'g') FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            "   AND query NOT LIKE '%%pg_stat_statements%%' ORDER BY total_exec_time DESC LIMIT 20"
        ).fetchall()
        conn.execute(sql.SQL("ALTER DATABASE {} RESET pg_stat_statements.track").format(
            sql.Identifier(conn.info.dbname)))  # fmt: skip
    return [[str(calls), fmt(ms * 1000 / (3 * runs), 1), query.replace("|", "\\|")] for calls, ms, query in got]


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--runs-per-side", type=int, default=3000, help="runs of three steps (and 3 x as many plain jobs)")
    p.add_argument("--profile", action="store_true", help="also each statement's time per job (pg_stat_statements)")
    args = p.parse_args()
    runs = 30 if args.smoke else args.runs_per_side
    got: dict[str, list[tuple[float, float, float]]] = {"run": [], "plain": []}
    statements: dict[str, list[list[str]]] = {}
    settings = {"shared_preload_libraries": "pg_stat_statements"} if args.profile else None
    with server(settings) as url:
        print_settings(url)
        with database(url, "workflow_worker") as db:
            for r in range(args.runs):
                for side in ("run", "plain") if r % 2 == 0 else ("plain", "run"):
                    progress(f"round {r + 1}/{args.runs}: {side}")
                    got[side].append(one_side(db, side, runs))
            for side in got if args.profile else ():
                progress(f"profile: {side}")
                statements[side] = profile(db, side, runs)
    jobs = 3 * runs

    def per_job(side: str, i: int) -> list[float]:
        """Measure i (0 seconds, 1 server CPU, 2 worker CPU) of each round, in µs per job."""
        return [values[i] * 1e6 / jobs for values in got[side]]

    rows = [
        [what, spread(per_job("run", i), 1), spread(per_job("plain", i), 1),
         "x" + paired_ratio(per_job("run", i), per_job("plain", i)), goal]
        for what, i, goal in (("wall time, µs per job", 0, "-"), ("server CPU, µs per job", 1, "x <= 1.2"),
                              ("worker process CPU, µs per job", 2, "-"))
    ]  # fmt: skip
    both = {side: [v[1] + v[2] for v in got[side]] for side in got}
    rows.append(["server and worker CPU together", "-", "-", "x" + paired_ratio(both["run"], both["plain"]), "-"])
    table(
        f"{TITLE} (median (range) of {args.runs} rounds, {runs} runs of 3 steps against {jobs} plain jobs)",
        ["per job", "linear run", "plain jobs, three names", "run / plain", "goal"],
        rows,
    )
    for side, lines in statements.items():
        table(
            f"Statements, {side} (pg_stat_statements, track = all; nested ones in their callers too)",
            ["calls", "µs per job", "statement"],
            lines,
        )


if __name__ == "__main__":
    main()
