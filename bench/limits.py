"""Scenario: queue limits. A rate-limited and a concurrency-limited queue under several
concurrent claimers, and the claim latency of limited queues beside an unlimited one.

Rate: the bucket's first burst of R claims is spent, then C connections claim batches
of 10 from the queue, limited to R claims a second, for D seconds; the figure is the
claims per second achieved against R (never above it; below it by what the claimers
could not take). Concurrency: C
connections claim batches of 5 from a queue limited to N running, hold each batch 5 ms
(a handler) and complete it; a watcher counts the queue's running jobs the whole time,
so the table shows the most ever seen beside N, and the jobs finished per second. Latency:
one connection claims one job and completes it, in turn from an unlimited queue (the
baseline, the path every queue without settings takes), a queue with a concurrency limit
and one with a rate limit, both set high enough never to bind: what the limited path
itself costs (the lock on the queue's row, counting its running jobs, spending a token).

    .build/venv/bin/python bench/limits.py [--claimers 4] [--seconds 5] [--samples 500] [--runs 3]
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from harness import (
    Stopwatch,
    database,
    fmt,
    median,
    parser,
    percentile,
    print_settings,
    progress,
    runs_text,
    server,
    spread,
    table,
)

TITLE = "Queue limits: a rate limit and a concurrency limit under concurrent claimers"
RATE = 200  # claims per second on the rate-limited queue
LIMIT = 4  # jobs running at once on the concurrency-limited queue
FILL = """
SELECT count(*)
  FROM treadle.enqueue_many((SELECT jsonb_agg(jsonb_build_object('name', 'bench', 'queue', %(queue)s::text))
                               FROM generate_series(1, 1000)))
"""
CLAIM = "SELECT id, lease_token FROM treadle.claim(%(worker)s, ARRAY[%(queue)s], batch => %(batch)s)"
COMPLETE = "SELECT treadle.complete_many(%(ids)s, %(tokens)s)"
RUNNING = "SELECT count(*) FROM treadle.jobs WHERE queue = 'conc' AND state = 'running'"


def reset(conn: psycopg.Connection[Any], thousands: int) -> None:
    conn.execute("TRUNCATE treadle.jobs, treadle.queues")
    for queue in ("unlimited", "rated", "conc", "conc-high", "rated-high"):
        for _ in range(thousands):
            conn.execute(FILL, {"queue": queue})
    conn.execute("SELECT treadle.set_queue('rated', rate_limit => %s, rate_period => '1 second')", (RATE,))
    conn.execute("SELECT treadle.set_queue('conc', concurrency => %s)", (LIMIT,))
    conn.execute("SELECT treadle.set_queue('conc-high', concurrency => 100000)")
    conn.execute("SELECT treadle.set_queue('rated-high', rate_limit => 1000000, rate_period => '1 second')")
    conn.execute("VACUUM ANALYZE treadle.jobs")


def rate_run(url: str, claimers: int, seconds: float) -> float:
    """Claims per second achieved on the rate-limited queue, once its first burst is spent."""
    conns = [psycopg.connect(url, autocommit=True) for _ in range(claimers)]
    while conns[0].execute(CLAIM, {"worker": "burst", "queue": "rated", "batch": 1000}).fetchall():
        pass  # the bucket starts full: empty it, so the window below sees the steady rate
    start = threading.Barrier(claimers)

    def claim(i: int) -> int:
        start.wait()
        until = time.monotonic() + seconds
        taken = 0
        while time.monotonic() < until:
            taken += len(conns[i].execute(CLAIM, {"worker": f"r{i}", "queue": "rated", "batch": 10}).fetchall())
        return taken

    try:
        with ThreadPoolExecutor(claimers) as pool:
            return sum(pool.map(claim, range(claimers))) / seconds
    finally:
        for conn in conns:
            conn.close()


def concurrency_run(url: str, claimers: int, seconds: float) -> tuple[int, float]:
    """The most running jobs seen on the concurrency-limited queue, and jobs finished per second."""
    conns = [psycopg.connect(url, autocommit=True) for _ in range(claimers)]
    start = threading.Barrier(claimers + 1)
    stop = threading.Event()
    most = 0

    def work(i: int) -> int:
        start.wait()
        done = 0
        while not stop.is_set():
            rows = conns[i].execute(CLAIM, {"worker": f"c{i}", "queue": "conc", "batch": 5}).fetchall()
            if not rows:
                time.sleep(0.001)
                continue
            time.sleep(0.005)
            conns[i].execute(COMPLETE, {"ids": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
            done += len(rows)
        return done

    with psycopg.connect(url, autocommit=True) as watcher, ThreadPoolExecutor(claimers) as pool:
        futures = [pool.submit(work, i) for i in range(claimers)]
        start.wait()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            row = watcher.execute(RUNNING).fetchone()
            most = max(most, int(row[0]) if row else 0)
        stop.set()
        finished = sum(f.result() for f in futures)
    for conn in conns:
        conn.close()
    return most, finished / seconds


def latency_run(url: str, samples: int) -> dict[str, list[float]]:
    """Milliseconds of claiming one job (and completing it, untimed) per queue, interleaved."""
    queues = ("unlimited", "conc-high", "rated-high")
    times: dict[str, list[float]] = {q: [] for q in queues}
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()

        def one(queue: str) -> float:
            with Stopwatch() as s:
                cur.execute(CLAIM, {"worker": "lat", "queue": queue, "batch": 1}, prepare=True)
                rows = cur.fetchall()
            if len(rows) != 1:
                raise RuntimeError(f"a claim of {queue} returned {len(rows)} jobs")
            cur.execute(COMPLETE, {"ids": [rows[0][0]], "tokens": [rows[0][1]]}, prepare=True)
            return s.ms

        for _ in range(20):  # warm-up
            for q in queues:
                one(q)
        for i in range(samples):
            order: tuple[str, ...] = queues if i % 2 else tuple(reversed(queues))
            for q in order:
                times[q].append(one(q))
    return times


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--claimers", type=int, default=4, help="concurrent claiming connections (default 4)")
    p.add_argument("--seconds", type=float, default=5.0, help="how long each rate and concurrency run lasts")
    p.add_argument("--samples", type=int, default=500, help="claims timed per queue and run (default 500)")
    args = p.parse_args()
    claimers, seconds, samples, thousands = args.claimers, args.seconds, args.samples, 20
    if args.smoke:
        seconds, samples, thousands = 1.0, 30, 2

    rates: list[float] = []
    most: list[int] = []
    finished: list[float] = []
    p50: dict[str, list[float]] = {}
    p99: dict[str, list[float]] = {}
    with server() as url, database(url, "limits") as db:
        print_settings(db)
        for run in range(args.runs):
            with psycopg.connect(db, autocommit=True) as admin:
                progress(f"run {run + 1}/{args.runs}: filling")
                reset(admin, thousands)
            progress(f"run {run + 1}/{args.runs}: rate limit, {claimers} claimers, {seconds:g} s")
            rates.append(rate_run(db, claimers, seconds))
            progress(f"run {run + 1}/{args.runs}: concurrency limit, {claimers} claimers, {seconds:g} s")
            m, f = concurrency_run(db, claimers, seconds)
            most.append(m)
            finished.append(f)
            progress(f"run {run + 1}/{args.runs}: claim latency, {samples} samples per queue")
            for queue, values in latency_run(db, samples).items():
                p50.setdefault(queue, []).append(percentile(values, 50))
                p99.setdefault(queue, []).append(percentile(values, 99))

    table(
        TITLE,
        ["queue", "configured", "achieved", "achieved / configured"],
        [
            [f"rate-limited ({claimers} claimers)", f"{RATE}/s", f"{spread(rates, 0)}/s",
             fmt(median(rates) / RATE)],
            [f"concurrency-limited ({claimers} claimers, 5 ms per batch)", f"{LIMIT} running",
             f"at most {max(most)} running seen; {spread(finished, 0)} jobs/s", fmt(max(most) / LIMIT)],
        ],
        notes=[
            f"{runs_text(args.runs)}, median (range), over {seconds:g} s each. The rate is measured after the "
            "bucket's first burst (a full bucket lets rate_limit claims through at once). Most running: the "
            "largest count a watching connection read while the claimers worked.",
        ],
    )
    base50, base99 = median(p50["unlimited"]), median(p99["unlimited"])
    rows = []
    for queue, label in (("unlimited", "unlimited (no row in treadle.queues)"),
                         ("conc-high", "concurrency limit 100000"), ("rated-high", "rate limit 1000000/s")):
        rows.append([label, spread(p50[queue]), fmt(median(p50[queue]) / base50), spread(p99[queue]),
                     fmt(median(p99[queue]) / base99)])
    table(
        "Claim latency of limited queues beside an unlimited one, milliseconds",
        ["queue", "p50", "ratio", "p99", "ratio"],
        rows,
        notes=[f"{samples} single-job claims per queue and run, interleaved, {runs_text(args.runs)}: "
               "median (range) of the runs' percentiles; ratio against the unlimited queue. "
               "The limits are set so high that they never bind: this is what the limited path costs."],
    )


if __name__ == "__main__":
    main()
