"""The Python client's enqueue_many against another revision's client, and a raw INSERT ... SELECT.

Jobs per second and CPU per job of `treadle.enqueue_many` through the Python client at 100
and 10,000 jobs per call: this tree's client, another revision's (`--before REV`, its
python/src/treadle from `git archive`, imported beside this one as `treadle_before`; by
default the parent of the first commit of the one-pass client) and a raw `INSERT ... SELECT`
from an array, all on one connection of one database, interleaved call by call (the order
rotating). Each run's ratio to raw is taken in that run; the server's CPU per job is the
backend's (/proc, user + system), the client's is this process's.

    .build/venv/bin/python bench/client_bulk.py [--runs 5] [--calls 5]
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from harness import RAW_INSERT_SELECT, database, paired_ratio, parser, print_settings, progress, reset_tables
from harness import runs_text, server, spread, table
from treadle.client import enqueue_many

TITLE = "enqueue_many through the Python client, against another revision's client"
ROOT = Path(__file__).resolve().parents[1]
RAW = RAW_INSERT_SELECT + " RETURNING id"
TICK = os.sysconf("SC_CLK_TCK")


def default_before() -> str:
    first = subprocess.run(["git", "log", "--reverse", "--format=%H", "-S", "_array_params", "--",
                            "python/src/treadle/client.py"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    return f"{first[0]}^" if first else "HEAD"


def before_client(rev: str, folder: str) -> Callable[..., Any]:
    """`enqueue_many` of the client at `rev`, imported as treadle_before."""
    archive = subprocess.run(["git", "archive", rev, "python/src/treadle"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    (Path(folder) / "python/src/treadle").rename(Path(folder) / "treadle_before")
    sys.path.insert(0, folder)
    return importlib.import_module("treadle_before.client").enqueue_many  # type: ignore[no-any-return]


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--before", default=None, help="the revision to compare with (default: before the one-pass client)")
    p.add_argument("--calls", type=int, default=5, help="calls of 10,000 per side and run; 60x as many of 100")
    args = p.parse_args()
    sizes = ((20, 6), (200, 3)) if args.smoke else ((100, args.calls * 60), (10_000, args.calls))
    rev = args.before or default_before()
    short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as folder, server() as url, database(url, "client_bulk") as db:
        before_many = before_client(rev, folder)
        print_settings(db)
        with psycopg.connect(db, autocommit=True) as conn:
            pid, cur = conn.info.backend_pid, conn.cursor()
            local = Path(f"/proc/{pid}/stat").exists()
            for size, calls in sizes:
                def jobs(first: int, size: int = size) -> list[dict[str, Any]]:
                    return [{"name": "bench", "args": {"i": i}} for i in range(first, first + size)]

                def raw(first: int, size: int = size) -> None:
                    cur.execute(RAW, {"name": "bench", "args": [Jsonb({"i": i}) for i in range(first, first + size)]},
                                prepare=True)
                    cur.fetchall()

                sides: list[tuple[str, Callable[[int], Any]]] = [
                    (f"before ({short}), {size:,} per call", lambda first: before_many(conn, jobs(first))),
                    (f"this tree, {size:,} per call", lambda first: enqueue_many(conn, jobs(first))),
                    (f"raw INSERT ... SELECT, {size:,} per call", raw)]
                rates: dict[str, list[float]] = {label: [] for label, _ in sides}
                server_us: dict[str, list[float]] = {label: [] for label, _ in sides}
                client_us: dict[str, list[float]] = {label: [] for label, _ in sides}
                for run in range(args.runs):
                    progress(f"{size:,} per call: run {run + 1}/{args.runs}")
                    reset_tables(conn)
                    for _, side in sides:  # warm up: the extension check, prepared statements
                        side(10_000_000)
                    spent = {label: [0.0, 0.0, 0.0] for label, _ in sides}
                    for call in range(calls):
                        for label, side in sides[call % 3:] + sides[:call % 3]:
                            wall, cpu, own = time.perf_counter(), backend_cpu(pid) if local else 0.0, time.process_time()
                            side(call * size)
                            acc = spent[label]
                            acc[0] += time.perf_counter() - wall
                            acc[1] += (backend_cpu(pid) if local else 0.0) - cpu
                            acc[2] += time.process_time() - own
                    for label, (wall_s, cpu_s, own_s) in spent.items():
                        count = calls * size
                        rates[label].append(count / wall_s)
                        server_us[label].append(cpu_s / count * 1e6)
                        client_us[label].append(own_s / count * 1e6)
                raw_rates = rates[sides[-1][0]]
                for label, _ in sides:
                    rows.append([label, spread(rates[label], 0), paired_ratio(rates[label], raw_rates),
                                 spread(server_us[label], 1) if local else "-", spread(client_us[label], 1)])
    table(TITLE, ["path", "jobs/s", "ratio to raw", "server CPU µs/job", "client CPU µs/job"], rows,
          notes=[f"{runs_text(args.runs)}: median (range); the sides interleaved call by call. Client CPU counts "
                 "building each call's job dicts (and, for raw, its Jsonb list). Goal (issue 25): >= 0.8 of raw."])


if __name__ == "__main__":
    main()
