"""What one enqueue_many call costs, before a change and now, in one run: server CPU per call.

Two databases on one server, each with treadle installed as plain SQL: one from
--before REV (built from `git archive`; default: main), one from this tree, each with
the raw baseline table. One connection per database, autocommit, prepared statements;
blocks of about --rows jobs per kind, interleaved (before, now; then now, before; ...):
a raw `INSERT ... SELECT` from an array, `treadle.enqueue_many` of one queue, of ten
queues, and, with --guarded, of one queue while another queue has a max_depth and a
role is a tenant (the rules read, on both sides); each at 100 and 10,000 jobs per call.
Each block's figure is the backend's CPU time (/proc/PID/stat) over its calls, per call;
wall time per call beside it. The tables are emptied before each block. Per run: the
median of the blocks; over runs: median (range).

    .build/venv/bin/python bench/enqueue_many_cost.py [--before main] [--rows 20000] [--blocks 5] [--runs 3]
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    RAW_INSERT_SELECT,
    RAW_SCHEMA,
    cpu_seconds,
    median,
    paired_ratio,
    parser,
    print_settings,
    progress,
    server,
    spread,
    table,
)
from nokeys import databases, plain_script
from psycopg.types.json import Jsonb

TITLE = "One enqueue_many: server CPU per call, before and now"
SQL_ENQUEUE_MANY = "SELECT id FROM treadle.enqueue_many(%(jobs)s) AS id"
RAW = RAW_INSERT_SELECT + " RETURNING id"
SHAPES = ("raw INSERT ... SELECT", "enqueue_many, 1 queue", "enqueue_many, 10 queues")
GUARDED = "enqueue_many, 1 queue, rules elsewhere"


def block(conn: psycopg.Connection[Any], shape: str, size: int, first: int, rows: int) -> tuple[float, float]:
    """Server µs and wall µs per call of calls of `size` jobs, about `rows` jobs in all."""
    cur = conn.cursor()
    call: Callable[[int], object]
    if shape == "raw INSERT ... SELECT":

        def call(start: int) -> object:
            return cur.execute(
                RAW, {"name": "bench", "args": [Jsonb({"i": i}) for i in range(start, start + size)]}, prepare=True
            ).fetchall()
    else:
        queues = 10 if shape == "enqueue_many, 10 queues" else 1

        def call(start: int) -> object:
            jobs = [{"name": "bench", "args": {"i": i}, "queue": f"q{i % queues}"} for i in range(start, start + size)]
            return cur.execute(SQL_ENQUEUE_MANY, {"jobs": Jsonb(jobs)}, prepare=True).fetchall()

    calls = max(1, rows // size)
    pid = conn.info.backend_pid
    server0, wall0 = cpu_seconds(pid) or 0.0, time.perf_counter()
    for c in range(calls):
        call(first + c * size)
    wall = time.perf_counter() - wall0
    return ((cpu_seconds(pid) or 0.0) - server0) / calls * 1e6, wall / calls * 1e6


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--before", default="main", help="the revision to compare with (default main)")
    p.add_argument("--rows", type=int, default=20_000, help="jobs per block (default 20,000)")
    p.add_argument("--blocks", type=int, default=5, help="blocks per kind, side and run (default 5)")
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000], help="jobs per call (default 100 10000)")
    p.add_argument("--guarded", action="store_true", help="also a batch while rules hold elsewhere")
    args = p.parse_args()
    rows, blocks, sizes = (200, 2, [10, 100]) if args.smoke else (args.rows, args.blocks, args.sizes)
    shapes = [*SHAPES, *([GUARDED] if args.guarded else [])]
    kinds = [(shape, size) for size in sizes for shape in shapes]
    sides = ("before", "now")
    # figures[side][kind] -> (server, wall) per run
    figures: dict[str, dict[tuple[str, int], list[tuple[float, float]]]] = {s: {k: [] for k in kinds} for s in sides}
    with tempfile.TemporaryDirectory() as tmp, server() as url:
        scripts = {"before": plain_script(args.before, Path(tmp)), "now": plain_script(".", Path(tmp))}
        with databases(url, scripts) as urls:
            print_settings(urls["now"])
            conns = {s: psycopg.connect(urls[s], autocommit=True) for s in sides}
            try:
                for conn in conns.values():
                    conn.execute(RAW_SCHEMA)
                for run in range(args.runs):
                    progress(f"run {run + 1}/{args.runs}")
                    per: dict[str, dict[tuple[str, int], list[tuple[float, float]]]] = {
                        s: {k: [] for k in kinds} for s in sides}  # fmt: skip
                    for conn in conns.values():
                        conn.execute("TRUNCATE treadle.jobs, bench_raw.jobs")
                        for shape, size in kinds:  # warm up: plans made, the custom ones left behind
                            for _ in range(6):
                                block(conn, shape, min(size, 100), 10_000_000, min(size, 100))
                    first = 0
                    for b in range(blocks):
                        order = list(sides) if b % 2 == 0 else list(reversed(sides))
                        for shape, size in kinds:
                            for side in order:
                                conn = conns[side]
                                conn.execute("TRUNCATE treadle.jobs, bench_raw.jobs")
                                if shape == GUARDED:
                                    conn.execute("SELECT treadle.set_queue('elsewhere', max_depth => 1000000)")
                                    conn.execute("SELECT treadle.set_tenant('pg_monitor', 'elsewhere.')")
                                per[side][(shape, size)].append(block(conn, shape, size, first, rows))
                                if shape == GUARDED:
                                    conn.execute(
                                        "SELECT treadle.set_queue('elsewhere'), treadle.set_tenant('pg_monitor', NULL)"
                                    )
                            first += rows
                    for side in sides:
                        for kind in kinds:
                            figures[side][kind].append(
                                (median([v[0] for v in per[side][kind]]), median([v[1] for v in per[side][kind]]))
                            )
            finally:
                for conn in conns.values():
                    conn.close()

    out = []
    for shape, size in kinds:
        for side in sides:
            f = figures[side][(shape, size)]
            raw = figures[side][("raw INSERT ... SELECT", size)]
            server_us, wall_us = [v[0] for v in f], [v[1] for v in f]
            out.append([f"{shape}, {size:,} per call", side, spread(server_us, 0),
                        paired_ratio(server_us, [v[0] for v in figures["before"][(shape, size)]]),
                        paired_ratio(server_us, [v[0] for v in raw]), spread(wall_us, 0)])  # fmt: skip
    table(
        TITLE,
        ["call", "side", "server µs", "x before", "x raw (server)", "wall µs"],
        out,
        notes=[f"before: {args.before}; about {rows:,} jobs per block, {blocks} blocks per run, interleaved, the "
               f"tables emptied before each; {args.runs} runs: median (range) of the runs' medians. x raw: run by run, "
               "against the raw INSERT ... SELECT of the same size on the same side's connection."],
    )  # fmt: skip


if __name__ == "__main__":
    main()
