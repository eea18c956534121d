"""Chains and trickles: work a worker's own jobs make, and jobs that arrive one at a time.

Chain: one worker process (bench/worker_treadle.py, concurrency 10, handler `chain`) runs a
chain of --hops jobs, each enqueuing the next to the same queue on its own connection; the
figure is the time from the first job's creation to the last one's finish (the database's
clock), per hop. Trickle: the same worker with empty handlers while this script enqueues
--jobs jobs one at a time, each in its own transaction, --gap ms apart; the figure is the
CPU time (user + system) the worker process and its server backends used over the jobs,
and the mean time from a job's creation to its finish. Both with LISTEN on and off
(poll_interval --poll-interval s).

There is no raw baseline: the sides are this tree's worker and, with `--against DIR`,
another tree's (DIR is its python/src, put first on PYTHONPATH), taking turns run by run
on the same server and SQL.

    .build/venv/bin/python bench/chain.py [--hops 100] [--jobs 1000] [--gap 5] [--poll-interval 0.2]
                                          [--runs 3] [--against DIR]
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
from harness import database, fmt, median, parser, print_settings, progress, server, spread, table, worker_processes
from load import CpuMeter, python_path

TITLE = "Chain: a job a handler enqueues, claimed by the same worker, ms per hop"
TRICKLE_TITLE = "Trickle: jobs enqueued one at a time, worker + backend CPU per job"


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DELETE FROM treadle.jobs")


def done(conn: psycopg.Connection[Any], count: int) -> bool:
    row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'completed'").fetchone()
    return row is not None and row[0] >= count


def wait_done(conn: psycopg.Connection[Any], count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done(conn, count):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} jobs did not complete within {timeout:g} s")
        time.sleep(0.05)


def span_ms(conn: psycopg.Connection[Any]) -> tuple[float, float]:
    """(first creation to last finish, mean creation to finish), milliseconds."""
    row = conn.execute(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at)) * 1000,"
        "       extract(epoch FROM avg(finished_at - created_at)) * 1000"
        "  FROM treadle.jobs WHERE state = 'completed'"
    ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


def chain_run(conn: psycopg.Connection[Any], dsn: str, hops: int, options: list[str]) -> float:
    reset(conn)
    with worker_processes("treadle", dsn, 1, ["--handler", "chain", *options]):
        conn.execute("SELECT treadle.enqueue('bench', jsonb_build_object('left', %s::int))", [hops - 1])
        wait_done(conn, hops, timeout=hops * 2.0 + 60)
        total, _ = span_ms(conn)
    return total / hops


def trickle_run(
    conn: psycopg.Connection[Any], dsn: str, jobs: int, gap: float, options: list[str]
) -> tuple[float, float]:
    reset(conn)
    with worker_processes("treadle", dsn, 1, options) as procs:
        meter = CpuMeter(conn, "treadle", procs)
        start = time.monotonic()
        for i in range(jobs):
            conn.execute("SELECT treadle.enqueue('bench', '{}')")
            time.sleep(max(0.0, start + (i + 1) * gap - time.monotonic()))
        wait_done(conn, jobs, timeout=120)
        workers, backends = meter.used()
        _, latency = span_ms(conn)
    return ((workers or 0.0) + (backends or 0.0)) / jobs * 1000, latency


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--hops", type=int, default=100, help="jobs in the chain (default 100)")
    p.add_argument("--jobs", type=int, default=1000, help="jobs in the trickle (default 1,000)")
    p.add_argument("--gap", type=float, default=5.0, help="milliseconds between the trickle's enqueues (default 5)")
    p.add_argument("--poll-interval", type=float, default=0.2, help="the worker's poll_interval (default 0.2 s)")
    p.add_argument("--against", type=Path, default=None, help="another tree's python/src, as a second side")
    args = p.parse_args()
    hops, jobs = (10, 50) if args.smoke else (args.hops, args.jobs)
    sides = ["this", "against"] if args.against is not None else ["this"]
    modes = {"LISTEN": [], "polling": ["--no-listen"]}
    chain: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    latency: dict[tuple[str, str], list[float]] = {}
    with server() as url, database(url, "chain") as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        print_settings(url)
        for run in range(args.runs):
            order = sides if run % 2 == 0 else sides[::-1]
            for mode, flags in modes.items():
                options = ["--poll-interval", str(args.poll_interval), *flags]
                for side in order:
                    with python_path(args.against if side == "against" else None):
                        progress(f"{side}, {mode}: run {run + 1}/{args.runs}, chain of {hops}")
                        chain.setdefault((side, mode), []).append(chain_run(conn, dsn, hops, options))
                        progress(f"{side}, {mode}: run {run + 1}/{args.runs}, trickle of {jobs}")
                        used, waited = trickle_run(conn, dsn, jobs, args.gap / 1000, options)
                        cpu.setdefault((side, mode), []).append(used)
                        latency.setdefault((side, mode), []).append(waited)
    names = {"this": "this tree", "against": f"{args.against}"}
    table(
        TITLE,
        ["worker", "mode", "ms per hop"],
        [[names[s], m, spread(chain[(s, m)])] for m in modes for s in sides],
        [f"{hops} hops, poll_interval {args.poll_interval} s; median (range) of {args.runs} runs."],
    )
    table(
        TRICKLE_TITLE,
        ["worker", "mode", "CPU ms per job", "ms from enqueue to finish"],
        [[names[s], m, spread(cpu[(s, m)], 3), spread(latency[(s, m)])] for m in modes for s in sides],
        [f"{jobs} jobs, one every {args.gap:g} ms; median (range) of {args.runs} runs."],
    )
    if args.against is not None:
        rows = []
        for m in modes:
            rows.append(
                [
                    m,
                    fmt(median(chain[("this", m)]) / median(chain[("against", m)])),
                    fmt(median(cpu[("this", m)]) / median(cpu[("against", m)])),
                ]
            )
        table("This tree against the other", ["mode", "ms per hop, ratio", "CPU per job, ratio"], rows)


if __name__ == "__main__":
    main()
