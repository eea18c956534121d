"""The claim and the held snapshot, this version against the last release, in one run.

Two databases on one server: one with `CREATE EXTENSION treadle VERSION '0.3.0'`, one
with the version under development (both scripts are installed by `make install`).
The same scenario runs on each, alternating (0.3.0 first in odd runs, last in even
ones), and each figure is the median of the runs; the ratio is new / old run by run
(median and range): above 1 is slower for times, below 1 slower for rates.

  claim       as claim_latency.py: p50 and p99 of one autocommit
              `treadle.claim(..., batch => 1)`, samples interleaved one for one
              between the two databases, on the same rows (10,000 waiting; --rows
              rows of which all but 1,000 are finished).
  held        as held_snapshot.py, in SQL: two drainers loop on
              `treadle.complete_and_claim` (batch 10), a producer keeps 5,000 jobs
              waiting, a probe claims one job every 50 ms and a rescue runs every
              second; after --warmup seconds another session holds a REPEATABLE READ
              snapshot for --hold seconds. Jobs/s before and during the hold, the
              probe's claim p99 during the hold, server time per claim and rescue.
              (SQL drainers, not the worker: the package speaks only its own version.)

    .build/venv/bin/python bench/versions.py [--runs 3] [--rows 1000000] [--warmup 10] [--hold 30]
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from harness import (
    ROOT,
    TREADLE_CLAIM,
    Stopwatch,
    parser,
    percentile,
    print_settings,
    progress,
    runs_text,
    server,
    spread,
    table,
    with_db,
)

TITLE = "This version against the last release: the claim and the held snapshot, one run"
OLD = "0.3.0"
NEW = next(line.split("'")[1] for line in (ROOT / "treadle.control").read_text().splitlines()
           if line.startswith("default_version"))
CLAIM_PARAMS = {"worker_id": "bench", "queue": "default", "names": ["bench"], "batch": 1, "lease": "30 seconds"}
WARMUP = 20
FILL = """
INSERT INTO treadle.jobs (queue, name, args, state, run_at, attempt, worker_id, created_at, started_at, finished_at)
SELECT 'default', 'bench', jsonb_build_object('i', g), f.state,
       now() - interval '1 hour' + g * interval '1 millisecond', f.attempt, f.worker_id,
       now() - interval '1 hour', f.started_at, f.finished_at
  FROM generate_series(1, %(finished)s + %(waiting)s) AS g
 CROSS JOIN LATERAL (
       SELECT CASE WHEN g <= %(finished)s THEN 'completed' ELSE 'available' END AS state,
              CASE WHEN g <= %(finished)s THEN 1 ELSE 0 END AS attempt,
              CASE WHEN g <= %(finished)s THEN 'bench' END AS worker_id,
              CASE WHEN g <= %(finished)s THEN now() END AS started_at,
              CASE WHEN g <= %(finished)s THEN now() END AS finished_at) AS f
"""
UNCLAIM = """
UPDATE treadle.jobs SET state = 'available', attempt = 0, lease_until = NULL, lease_token = NULL,
                        worker_id = NULL, started_at = NULL, ready_txid = pg_current_xact_id()
 WHERE state = 'running'
"""
DRAIN = """
SELECT (c.job).id, (c.job).lease_token
  FROM treadle.complete_and_claim(%(ids)s::bigint[], %(tokens)s::uuid[], NULL, %(worker)s, ARRAY['default'],
                                  ARRAY['bench'], 10, '30 seconds') AS c
 WHERE (c.job).id IS NOT NULL
"""
PROBE_CLAIM = """
SELECT id, lease_token FROM treadle.claim(worker_id => 'probe', queues => ARRAY['default'], names => ARRAY['bench'],
                                          batch => 1, lease => '30 seconds')
"""
BACKLOG = 5000
CHUNK = 1000


@contextmanager
def databases(url: str) -> Iterator[dict[str, str]]:
    """A database per version, each with treadle at that version; dropped afterwards."""
    urls = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for version in (OLD, NEW):
            name = f"treadle_bench_v{version.replace('.', '_')}_{os.getpid()}"
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
            urls[version] = with_db(url, name)
            with psycopg.connect(urls[version], autocommit=True) as db:
                db.execute(f"CREATE EXTENSION treadle VERSION '{version}'")
                try:
                    db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                except psycopg.Error:
                    pass  # a server without it: the server times stay empty
                got = db.execute("SELECT extversion FROM pg_extension WHERE extname = 'treadle'").fetchone()
                assert got is not None and got[0] == version, got
    try:
        yield urls
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for db_url in urls.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{db_url.rpartition("/")[2].partition("?")[0]}" WITH (FORCE)')


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs CASCADE")
    conn.execute("VACUUM ANALYZE treadle.jobs")


def orders(runs: int) -> Iterator[tuple[int, tuple[str, str]]]:
    """Each run's order of the two versions: alternating, the old one first in the first run."""
    for run in range(runs):
        yield run, ((OLD, NEW) if run % 2 == 0 else (NEW, OLD))


# --- claim ----------------------------------------------------------------------------------

def sampler(conn: psycopg.Connection[Any]) -> Callable[[], float]:
    cur = conn.cursor()

    def claim() -> float:
        with Stopwatch() as s:
            cur.execute(TREADLE_CLAIM, CLAIM_PARAMS, prepare=True)
            rows = cur.fetchall()
        if len(rows) != 1:
            raise RuntimeError(f"a claim returned {len(rows)} jobs, expected 1")
        return s.ms

    return claim


def claim_case(urls: dict[str, str], label: str, waiting: int, finished: int, samples: int,
               runs: int) -> dict[str, dict[str, list[float]]]:
    """Per version, per run: claim p50 and p99, samples interleaved one for one."""
    out: dict[str, dict[str, list[float]]] = {v: {"p50": [], "p99": []} for v in urls}
    conns = {v: psycopg.connect(u, autocommit=True) for v, u in urls.items()}
    admins = {v: psycopg.connect(u, autocommit=True) for v, u in urls.items()}
    try:
        for version, admin in admins.items():
            progress(f"{label}: filling {version}")
            reset(admin)
            admin.execute(FILL, {"waiting": waiting, "finished": finished})
            admin.execute("VACUUM ANALYZE treadle.jobs")
        claims = {v: sampler(c) for v, c in conns.items()}
        for run, order in orders(runs):
            progress(f"{label}: run {run + 1}/{runs}, {samples} samples each, {order[0]} first")
            for _ in range(WARMUP):
                for v in order:
                    claims[v]()
            times: dict[str, list[float]] = {v: [] for v in urls}
            for i in range(samples):
                for v in (order if i % 2 == 0 else order[::-1]):
                    times[v].append(claims[v]())
            for v, values in times.items():
                out[v]["p50"].append(percentile(values, 50))
                out[v]["p99"].append(percentile(values, 99))
            for admin in admins.values():
                admin.execute(UNCLAIM)
                admin.execute("VACUUM ANALYZE treadle.jobs")
    finally:
        for c in (*conns.values(), *admins.values()):
            c.close()
    return out


# --- held snapshot --------------------------------------------------------------------------

def producer(url: str, stop: threading.Event) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = ANY ('{available,retryable}')"
                               ).fetchone()
            assert row is not None
            for _ in range(max(0, (BACKLOG - row[0]) // CHUNK)):
                conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb([{"name": "bench"}] * CHUNK)])
            stop.wait(0.2)


def drainer(url: str, name: str, stop: threading.Event, done: list[float]) -> None:
    ids: list[int] = []
    tokens: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        while not stop.is_set():
            cur.execute(DRAIN, {"ids": ids, "tokens": tokens, "worker": name}, prepare=True)
            rows = cur.fetchall()
            now = time.monotonic()
            done.extend(now for _ in ids)
            ids, tokens = [r[0] for r in rows], [str(r[1]) for r in rows]
            if not rows:
                stop.wait(0.05)


def prober(url: str, stop: threading.Event, probes: list[tuple[float, float]], rescues: list[float]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        last_rescue = 0.0
        while not stop.wait(0.05):
            with Stopwatch() as s:
                cur.execute(PROBE_CLAIM, prepare=True)
                rows = cur.fetchall()
            probes.append((time.monotonic(), s.ms))
            for row in rows:
                cur.execute("SELECT treadle.complete(%s, %s)", [row[0], row[1]], prepare=True)
            if time.monotonic() - last_rescue >= 1.0:
                with Stopwatch() as s:
                    cur.execute("SELECT treadle.rescue()", prepare=True)
                rescues.append(s.ms)
                last_rescue = time.monotonic()


def statement_ms(conn: psycopg.Connection[Any]) -> dict[str, float]:
    """Server ms per call of the claim and the rescue since the last reset (pg_stat_statements;
    nothing on a server that does not load it)."""
    try:
        rows = conn.execute(
            "SELECT CASE WHEN query LIKE '%%treadle.rescue()%%' THEN 'rescue' ELSE 'claim' END, "
            "       sum(total_exec_time) / nullif(sum(calls), 0) "
            "  FROM pg_stat_statements "
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "   AND (query LIKE '%%treadle.rescue()%%' OR query LIKE '%%treadle.claim(%%' "
            "        OR query LIKE '%%treadle.complete_and_claim(%%') "
            " GROUP BY 1").fetchall()
    except psycopg.Error:
        return {}
    return {kind: float(ms) for kind, ms in rows if ms is not None}


def held_run(url: str, warmup: float, hold: float) -> dict[str, float]:
    stop = threading.Event()
    done: list[float] = []
    probes: list[tuple[float, float]] = []
    rescues: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        try:
            conn.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            pass
        threads = [threading.Thread(target=producer, args=(url, stop), daemon=True),
                   threading.Thread(target=prober, args=(url, stop, probes, rescues), daemon=True)]
        threads += [threading.Thread(target=drainer, args=(url, f"drain-{i}", stop, done), daemon=True)
                    for i in range(2)]
        start = time.monotonic()
        for t in threads:
            t.start()
        holder = psycopg.connect(url, autocommit=True)
        try:
            time.sleep(warmup)
            held_at = time.monotonic()
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM treadle.workflows")
            time.sleep(hold)
            released_at = time.monotonic()
            holder.execute("COMMIT")
        finally:
            holder.close()
            stop.set()
            for t in threads:
                t.join(30)
        per_call = statement_ms(conn)
    settle = start + min(5.0, warmup / 2)  # the first seconds fill the backlog
    return {
        "before": sum(1 for d in done if settle <= d < held_at) / (held_at - settle),
        "held": sum(1 for d in done if held_at <= d < released_at) / (released_at - held_at),
        "probe p99": percentile([ms for at, ms in probes if held_at <= at < released_at], 99),
        "claim ms": per_call.get("claim", float("nan")),
        "rescue ms": per_call.get("rescue", float("nan")),
    }


def held_case(urls: dict[str, str], warmup: float, hold: float, runs: int) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {v: {} for v in urls}
    for run, order in orders(runs):
        for version in order:
            progress(f"held: run {run + 1}/{runs}, {version}: {warmup:g} s, then {hold:g} s held")
            for key, value in held_run(urls[version], warmup, hold).items():
                out[version].setdefault(key, []).append(value)
    return out


def paired(new: list[float], old: list[float]) -> str:
    pairs = [n / o for n, o in zip(new, old, strict=True) if o and o == o and n == n]
    return spread(pairs) if pairs else "-"


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows in the large claim case (default 1,000,000)")
    p.add_argument("--samples", type=int, default=500, help="claims timed per run and version (default 500)")
    p.add_argument("--warmup", type=float, default=10, help="seconds of load before the hold (default 10)")
    p.add_argument("--hold", type=float, default=30, help="seconds the snapshot is held (default 30)")
    p.add_argument("--only", choices=["claim", "held"], help="one scenario only")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs must be at least 1")
    big, small, waiting, samples, warmup, hold = args.rows, 10_000, 1_000, args.samples, args.warmup, args.hold
    if args.smoke:
        big, small, waiting, samples, warmup, hold = 3_000, 300, 200, 30, 2.0, 2.0
    # every claim takes a waiting job (they are put back after each run)
    waiting = max(waiting, samples + WARMUP)

    rows: list[list[str]] = []
    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    with server(settings) as url, databases(url) as urls:
        print_settings(urls[NEW])
        if args.only in (None, "claim"):
            for label, w, f in ((f"claim, {small:,} rows waiting", small, 0),
                                (f"claim, {big:,} rows, {big - waiting:,} finished", waiting, big - waiting)):
                c = claim_case(urls, label, w, f, samples, args.runs)
                for key in ("p50", "p99"):
                    rows.append([label, f"{key}, ms", spread(c[OLD][key], 3), spread(c[NEW][key], 3),
                                 paired(c[NEW][key], c[OLD][key])])
        if args.only in (None, "held"):
            h = held_case(urls, warmup, hold, args.runs)
            for key, label in (("before", "jobs/s before the hold"), ("held", "jobs/s during the hold"),
                               ("probe p99", "probe claim p99 held, ms"), ("claim ms", "server ms per claim"),
                               ("rescue ms", "server ms per rescue")):
                rows.append([f"held snapshot, {hold:g} s", label, spread(h[OLD][key]), spread(h[NEW][key]),
                             paired(h[NEW][key], h[OLD][key])])
    table(TITLE,
          ["scenario", "figure", OLD, NEW, f"ratio {NEW} / {OLD}"], rows,
          notes=[f"{runs_text(args.runs)}, the versions alternating (each run's first version alternates); "
                 "median (range) of the runs; the ratio is taken run by run. Claim: "
                 f"{samples} claims per run and version, interleaved one for one. Held: two SQL drainers "
                 "(complete_and_claim, batch 10), a probe claim every 50 ms, a rescue every second."])


if __name__ == "__main__":
    main()
