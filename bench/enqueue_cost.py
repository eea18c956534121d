"""What one enqueue costs, before a change and now, in one run: server CPU per call.

Two databases on one server, each with treadle installed as plain SQL: one from
--before REV (built from `git archive`; default: main), one from this tree, each with
the raw baseline table. One connection per database, autocommit, and in blocks of
--calls calls, interleaved (before, now; then now, before; ...): a raw single-row
INSERT, `SELECT treadle.enqueue(name, args)` (prepared), the Python client's
`enqueue` (this tree's client on both) without options and with one (which sends every
option, as each call did before the client's short statement), and an enqueue with a
concurrency key of its own. Each block's figure is the backend's CPU time (/proc/PID/stat) over its calls,
and for the client, the client's own CPU time (time.process_time) as well; wall time
per call beside them. Per run: the median of the blocks; over runs: median (range).

    .build/venv/bin/python bench/enqueue_cost.py [--before main] [--calls 2000] [--blocks 5] [--runs 3]
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    RAW_INSERT,
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

from treadle.client import enqueue

TITLE = "One enqueue: server CPU per call, before and now"
SQL_ENQUEUE = "SELECT treadle.enqueue(%(name)s, %(args)s)"
SQL_KEYED = "SELECT treadle.enqueue('work', queue => 'cost', concurrency_key => %(key)s)"
KINDS = (
    "raw INSERT",
    "enqueue (SQL)",
    "enqueue (client)",
    "enqueue (client, every option sent)",
    "enqueue, a key of its own",
)


def block(conn: psycopg.Connection[Any], kind: str, first: int, calls: int) -> tuple[float, float, float]:
    """Server µs, client µs and wall µs per call of `calls` calls of one kind."""
    cur = conn.cursor()
    call: Callable[[int], object]
    if kind == "raw INSERT":
        call = lambda i: cur.execute(RAW_INSERT, {"name": "bench", "args": Jsonb({"i": i})}, prepare=True)  # noqa: E731
    elif kind == "enqueue (SQL)":
        call = lambda i: cur.execute(SQL_ENQUEUE, {"name": "bench", "args": Jsonb({"i": i})}, prepare=True)  # noqa: E731
    elif kind == "enqueue (client)":
        call = lambda i: enqueue(conn, "bench", {"i": i})  # noqa: E731
    elif kind == "enqueue (client, every option sent)":  # as every call was sent before 0.4.0's fast path
        call = lambda i: enqueue(conn, "bench", {"i": i}, queue="default")  # noqa: E731
    else:
        call = lambda i: cur.execute(SQL_KEYED, {"key": f"k{i}"}, prepare=True)  # noqa: E731
    pid = conn.info.backend_pid
    server0, client0, wall0 = cpu_seconds(pid) or 0.0, time.process_time(), time.perf_counter()
    for i in range(first, first + calls):
        call(i)
    wall, client = time.perf_counter() - wall0, time.process_time() - client0
    server_s = (cpu_seconds(pid) or 0.0) - server0
    return server_s / calls * 1e6, client / calls * 1e6, wall / calls * 1e6


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--before", default="main", help="the revision to compare with (default main)")
    p.add_argument("--calls", type=int, default=2000, help="calls per block (default 2000)")
    p.add_argument("--blocks", type=int, default=5, help="blocks per kind, side and run (default 5)")
    p.add_argument("--only", nargs="*", choices=KINDS, help="these kinds only")
    args = p.parse_args()
    calls, blocks = (50, 2) if args.smoke else (args.calls, args.blocks)
    kinds = args.only or list(KINDS)
    sides = ("before", "now")
    # figures[side][kind][measure] -> one value per run
    figures: dict[str, dict[str, dict[str, list[float]]]] = {
        s: {k: {"server": [], "client": [], "wall": []} for k in kinds} for s in sides
    }
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
                    per: dict[str, dict[str, list[tuple[float, float, float]]]] = {s: {k: [] for k in kinds}
                                                                                 for s in sides}  # fmt: skip
                    for conn in conns.values():
                        conn.execute("TRUNCATE treadle.jobs, treadle.key_slots, bench_raw.jobs CASCADE")
                        for kind in kinds:  # warm up
                            block(conn, kind, 10_000_000, 20)
                    first = 0
                    for b in range(blocks):
                        order = list(sides) if b % 2 == 0 else list(reversed(sides))
                        for kind in kinds:
                            for side in order:
                                per[side][kind].append(block(conns[side], kind, first, calls))
                            first += calls
                    for side in sides:
                        for kind in kinds:
                            for n, measure in enumerate(("server", "client", "wall")):
                                figures[side][kind][measure].append(median([v[n] for v in per[side][kind]]))
            finally:
                for conn in conns.values():
                    conn.close()

    rows = []
    for kind in kinds:
        for side in sides:
            f = figures[side][kind]
            raw = figures[side].get("raw INSERT") if "raw INSERT" in kinds else None

            def to_raw(measure: str, f: dict[str, list[float]] = f, raw: dict[str, list[float]] | None = raw) -> str:
                if raw is None:
                    return "-"
                # server: its CPU over raw's; wall: its rate over raw's (raw's time over its own)
                if measure == "server":
                    return paired_ratio(f[measure], raw[measure])
                return paired_ratio(raw[measure], f[measure])

            vs_before = paired_ratio(f["server"], figures["before"][kind]["server"])  # (a CPU figure may be 0 in a smoke run)
            rows.append([kind, side, spread(f["server"], 0), vs_before, to_raw("server"), spread(f["client"], 0),
                         spread(f["wall"], 0), to_raw("wall")])  # fmt: skip
    table(
        TITLE,
        ["call", "side", "server µs", "x before", "x raw (server)", "client µs", "wall µs", "rate / raw"],
        rows,
        notes=[f"before: {args.before}; {calls:,} calls per block, {blocks} blocks per run, interleaved; "
               f"{args.runs} runs: median (range) of the runs' medians. Client µs: this tree's client on both. "
               "x raw and rate / raw: run by run, against the raw INSERT on the same side's connection."],
    )  # fmt: skip


if __name__ == "__main__":
    main()
