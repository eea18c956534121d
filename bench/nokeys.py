"""A queue whose jobs have no concurrency key, before keys and now, in one run.

Two databases on one server, each with treadle installed as plain SQL: one from the
revision before concurrency keys (--before REV, built from `git archive`; by default the
parent of the first commit of sql/src/034_key_lanes.sql), one from this tree. The same
scenario runs on each, alternating (before first in odd runs, last in even ones); each
figure is the median of the runs, and the ratio now / before is taken run by run.

  drain   as load.py with one worker, in SQL: --jobs jobs without a key are enqueued
          (enqueue_many), then one session drains them with the worker's loop,
          `treadle.complete_and_claim` (batch 10). Jobs/s, and server ms per job
          (pg_stat_statements: the loop's statements' time over the jobs).
  held    versions.py's held snapshot: two SQL drainers, a producer keeping 5,000 jobs
          waiting, a probe claim every 50 ms and a rescue every second; after --warmup
          seconds a REPEATABLE READ snapshot is held for --hold seconds.

    .build/venv/bin/python bench/nokeys.py [--runs 5] [--before REV] [--jobs 20000] [--warmup 10] [--hold 10]
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from harness import ROOT, parser, print_settings, progress, runs_text, server, spread, table, with_db
from psycopg.types.json import Jsonb
from versions import DRAIN, held_run, reset

TITLE = "A queue without concurrency keys: before keys and now, one run"
SIDES = ("before", "now")
CHUNK = 1000


def first_keys_parent() -> str:
    """The parent of the commit that brought sql/src/034_key_lanes.sql."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--format=%H", "--", "sql/src/034_key_lanes.sql"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", out[-1] + "^"], check=True, capture_output=True, text=True
    ).stdout.strip()


def plain_script(rev: str, into: Path) -> Path:
    """The plain install script of `rev` (built by its own scripts/build-sql), or this tree's for '.'."""
    if rev == ".":
        tree = ROOT
    else:
        tree = into / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    out = into / f"plain-{'this' if rev == '.' else 'before'}"
    out.mkdir()
    subprocess.run(
        [str(tree / "scripts" / "build-sql"), "package", str(out)], check=True, cwd=tree, capture_output=True
    )
    found = sorted(p for p in out.glob("treadle-*.sql") if "--" not in p.name and "pgtle" not in p.name)
    assert found, f"no plain script built for {rev}"
    return found[-1]


@contextmanager
def databases(url: str, scripts: dict[str, Path]) -> Iterator[dict[str, str]]:
    urls: dict[str, str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for side, script in scripts.items():
            name = f"treadle_bench_nokeys_{side}_{os.getpid()}"
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
            urls[side] = with_db(url, name)
            with psycopg.connect(urls[side], autocommit=True) as db:
                db.execute(script.read_text())  # type: ignore[arg-type]  # a whole script, no parameters
                try:
                    db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                except psycopg.Error:
                    pass  # a server without it: the server times stay empty
    try:
        yield urls
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for db_url in urls.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{db_url.rpartition("/")[2].partition("?")[0]}" WITH (FORCE)')


def loop_ms(conn: psycopg.Connection[Any]) -> float:
    """Server ms spent in complete_and_claim since the last reset (nan without pg_stat_statements)."""
    try:
        row = conn.execute(
            "SELECT sum(total_exec_time) FROM pg_stat_statements "
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "   AND query LIKE '%%treadle.complete_and_claim(%%'"
        ).fetchone()
    except psycopg.Error:
        return float("nan")
    return float(row[0]) if row and row[0] is not None else float("nan")


def drain_run(url: str, jobs: int) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        for start in range(0, jobs, CHUNK):
            conn.execute(
                "SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb([{"name": "bench"}] * min(CHUNK, jobs - start))]
            )
        conn.execute("VACUUM ANALYZE treadle.jobs")
        try:
            conn.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            pass
        cur = conn.cursor()
        ids: list[int] = []
        tokens: list[str] = []
        done = 0
        began = time.perf_counter()
        while True:
            cur.execute(DRAIN, {"ids": ids, "tokens": tokens, "worker": "drain"}, prepare=True)
            rows = cur.fetchall()
            done += len(ids)
            if not rows:
                break
            ids, tokens = [r[0] for r in rows], [str(r[1]) for r in rows]
        took = time.perf_counter() - began
        row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'completed'").fetchone()
        assert row is not None and row[0] == jobs == done, (row, jobs, done)
        return {"jobs/s": jobs / took, "server ms per job": loop_ms(conn) / jobs}


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument(
        "--before",
        metavar="REV",
        help="the revision before keys (default: the parent of the "
        "first commit of sql/src/034_key_lanes.sql); '.' is this tree",
    )
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (default 20,000)")
    p.add_argument("--warmup", type=float, default=10, help="seconds of load before the hold (default 10)")
    p.add_argument("--hold", type=float, default=10, help="seconds the snapshot is held (default 10)")
    p.add_argument("--only", choices=["drain", "held"], help="one scenario only")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs must be at least 1")
    jobs, warmup, hold = args.jobs, args.warmup, args.hold
    if args.smoke:
        jobs, warmup, hold = 500, 2.0, 2.0
    before = args.before or first_keys_parent()

    out: dict[str, dict[str, dict[str, list[float]]]] = {
        "drain": {s: {} for s in SIDES},
        "held": {s: {} for s in SIDES},
    }
    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    with tempfile.TemporaryDirectory() as tmp:
        progress(f"building the plain scripts of {before} and of this tree")
        scripts = {"before": plain_script(before, Path(tmp)), "now": plain_script(".", Path(tmp))}
        with server(settings) as url, databases(url, scripts) as urls:
            print_settings(urls["now"])
            for run in range(args.runs):
                order = SIDES if run % 2 == 0 else SIDES[::-1]
                for side in order:
                    if args.only in (None, "drain"):
                        progress(f"drain: run {run + 1}/{args.runs}, {side}: {jobs:,} jobs")
                        for key, value in drain_run(urls[side], jobs).items():
                            out["drain"][side].setdefault(key, []).append(value)
                for side in order:
                    if args.only in (None, "held"):
                        progress(f"held: run {run + 1}/{args.runs}, {side}: {warmup:g} s, then {hold:g} s held")
                        for key, value in held_run(urls[side], warmup, hold).items():
                            out["held"][side].setdefault(key, []).append(value)

    rows: list[list[str]] = []
    labels = {
        "drain": [("jobs/s", "jobs/s"), ("server ms per job", "server ms per job")],
        "held": [
            ("before", "jobs/s before the hold"),
            ("held", "jobs/s during the hold"),
            ("probe p99", "probe claim p99 held, ms"),
            ("claim ms", "server ms per claim"),
            ("rescue ms", "server ms per rescue"),
        ],
    }
    for scenario, figures in labels.items():
        got = out[scenario]
        if not got["now"]:
            continue
        name = f"drain, {jobs:,} jobs, one session" if scenario == "drain" else f"held snapshot, {hold:g} s"
        for key, label in figures:
            new, old = got["now"][key], got["before"][key]
            pairs = [n / o for n, o in zip(new, old, strict=True) if o and o == o and n == n]
            rows.append([name, label, spread(old, 3), spread(new, 3), spread(pairs, 3) if pairs else "-"])
    table(
        TITLE,
        ["scenario", "figure", f"before ({before})", "now", "ratio now / before"],
        rows,
        notes=[
            f"{runs_text(args.runs)}, the two sides alternating (each run's first side alternates); "
            "median (range) of the runs; the ratio is taken run by run. Both sides are plain SQL "
            "installs on one server; the queue's jobs have no concurrency key."
        ],
    )


if __name__ == "__main__":
    main()
