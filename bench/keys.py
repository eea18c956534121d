"""Scenario, concurrency keys: fair share between a heavy key and light ones, and what
the keys cost a queue that has none.

Fair share: one heavy key with 10,000 jobs, then ten light keys with 10 jobs each,
enqueued heavy first (one enqueue_many, one commit). `--workers` claimer threads (each
its own connection) claim one job at a time, hold it `--hold-ms` (a handler's work),
and complete it, until the light keys' jobs have all started. The figure is the time
from the commit of the enqueue to the start (the claim's answer) of each light job:
median and worst over the 100 light jobs, per run; with `key_limit` (the queue's
setting, default 2) against plain FIFO (the same jobs without a key). The two
alternate run by run.

The cost of a key: the server CPU time (the backend's /proc/PID/stat) of 2,000
`treadle.enqueue` calls, and of claiming and completing those jobs one by one, each
job with a key of its own (a slot taken at enqueue, given back at completion) against
no key, interleaved A, B, A, B. (A queue without keys runs the same statements as
before the feature: no trigger and no claim reads a key.)

The claim against active keys: p50 and p99 of one `treadle.claim(..., batch => 1)` (what
a worker calls) of a queue with 1, 100 and 10,000 active keys (`--active-keys`), each key
holding a released job (its slot taken) and at least 2 blocked behind it, against a queue
of the same table whose jobs have no key. Each claimed job is completed on another
connection (its key's next job is released), so that the claiming backend's CPU time
(/proc) is the claims' alone: server CPU per claim. The cases are interleaved sample by
sample, in a rotating order; `--samples` claims per case and run.

    .build/venv/bin/python bench/keys.py [--heavy 10000] [--light-keys 10] [--light-jobs 10]
                                         [--workers 4] [--hold-ms 2] [--key-limit 2] [--calls 2000]
                                         [--active-keys 1 100 10000] [--samples 300] [--runs 3]
                                         [--only fair|cost|claim]
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from harness import (
    Stopwatch,
    cpu_seconds,
    database,
    fmt,
    median,
    paired_ratio,
    parser,
    percentile,
    print_settings,
    progress,
    reset_tables,
    runs_text,
    server,
    spread,
    table,
)
from psycopg.types.json import Jsonb

TITLE = "Concurrency keys: how soon light keys start behind a heavy one, against FIFO"
WARMUP = 20
CLAIM = "SELECT id, lease_token FROM treadle.claim('bench', ARRAY[%(queue)s], batch => 1)"


def fair_share_run(db: str, keyed: bool, args: Any) -> tuple[float, float]:
    """One run: (median, worst) seconds from the enqueue's commit to a light job's start."""
    with psycopg.connect(db, autocommit=True) as conn:
        reset_tables(conn)
        conn.execute("TRUNCATE treadle.key_slots")
        conn.execute("SELECT treadle.set_queue('fair', key_limit => %s)", [args.key_limit])
        specs = [{"name": "work", "queue": "fair", **({"concurrency_key": "heavy"} if keyed else {})}
                 for _ in range(args.heavy)]  # fmt: skip
        specs += [{"name": "work", "queue": "fair", "args": {"light": True},
                   **({"concurrency_key": f"light-{k}"} if keyed else {})}
                  for k in range(args.light_keys) for _ in range(args.light_jobs)]  # fmt: skip
        conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(specs)])
        enqueued = time.monotonic()
    light_total = args.light_keys * args.light_jobs
    waits: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def claimer(i: int) -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            while not done.is_set():
                rows = conn.execute(
                    "SELECT id, lease_token, args ? 'light' FROM treadle.claim(%s, ARRAY['fair'], batch => 1)",
                    [f"w{i}"],
                ).fetchall()
                if not rows:
                    time.sleep(0.001)
                    continue
                started = time.monotonic()
                job_id, token, light = rows[0]
                if light:
                    with lock:
                        waits.append(started - enqueued)
                        if len(waits) == light_total:
                            done.set()
                time.sleep(args.hold_ms / 1000)
                conn.execute("SELECT treadle.complete(%s, %s)", [job_id, token])

    with ThreadPoolExecutor(args.workers) as pool:
        for future in [pool.submit(claimer, i) for i in range(args.workers)]:
            future.result()
    return median(waits), max(waits)


def cost_run(db: str, keyed: bool, calls: int) -> tuple[float, float]:
    """One run: server CPU microseconds per enqueue, and per claim + complete, with a key each or none."""
    with psycopg.connect(db, autocommit=True) as conn:
        reset_tables(conn)
        conn.execute("TRUNCATE treadle.key_slots")
        pid = conn.info.backend_pid
        before = cpu_seconds(pid) or 0.0
        for i in range(calls):
            conn.execute(
                "SELECT treadle.enqueue('work', queue => 'cost', concurrency_key => %s)", [f"k{i}" if keyed else None]
            )
        enqueue_cpu = (cpu_seconds(pid) or 0.0) - before
        before = cpu_seconds(pid) or 0.0
        for _ in range(calls):
            row = conn.execute("SELECT id, lease_token FROM treadle.claim('w', ARRAY['cost'])").fetchone()
            assert row is not None
            conn.execute("SELECT treadle.complete(%s, %s)", row)
        claim_cpu = (cpu_seconds(pid) or 0.0) - before
    return enqueue_cpu / calls * 1e6, claim_cpu / calls * 1e6


def fill_active_keys(conn: psycopg.Connection[Any], counts: list[int], claims: int) -> None:
    """Queue `keys-<n>` for each n in counts: n keys, each a released job and blocked ones
    behind it, enough for `claims` claims; queue `keys-0`: as many jobs without a key."""
    reset_tables(conn)
    conn.execute("TRUNCATE treadle.key_slots")
    for count in counts:
        per_key = max(3, -(-claims // count) + 2)  # the released job, 2 blocked at least, and room to spare
        queue = f"keys-{count}"
        conn.execute("SELECT treadle.set_queue(%s, key_limit => 1)", [queue])
        specs = [{"name": "work", "queue": queue, "concurrency_key": f"k{k}"}
                 for _ in range(per_key) for k in range(count)]  # fmt: skip
        for first in range(0, len(specs), 5000):
            conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(specs[first : first + 5000])])
        held = conn.execute("SELECT count(*) FROM treadle.jobs WHERE queue = %s AND state = 'available'",
                            [queue]).fetchone()  # fmt: skip
        assert held is not None and held[0] == count, (queue, held)
    specs = [{"name": "work", "queue": "keys-0"} for _ in range(claims + 2)]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(specs)])
    conn.execute("VACUUM ANALYZE treadle.jobs")


def claim_cost(db: str, counts: list[int], samples: int, runs: int) -> dict[tuple[int, int], list[float]]:
    """Per (keys, figure): each run's p50 and p99 ms (figures 50, 99) and server CPU µs per
    claim (figure 0); keys 0 is the queue without keys. Cases interleaved sample by sample."""
    cases = [0, *counts]
    figures: dict[tuple[int, int], list[float]] = {}
    with psycopg.connect(db, autocommit=True) as admin, psycopg.connect(db, autocommit=True) as finisher:
        claimers = {n: psycopg.connect(db, autocommit=True) for n in cases}
        try:
            pids = {n: conn.info.backend_pid for n, conn in claimers.items()}
            for run in range(runs):
                progress(f"claim against active keys: run {run + 1}/{runs}, filling")
                fill_active_keys(admin, counts, samples + WARMUP)
                times: dict[int, list[float]] = {n: [] for n in cases}
                cpu_at: dict[int, float | None] = {}
                for i in range(WARMUP + samples):
                    if i == WARMUP:
                        cpu_at = {n: cpu_seconds(pid) for n, pid in pids.items()}
                    for n in cases[i % len(cases) :] + cases[: i % len(cases)]:
                        with Stopwatch() as watch:
                            row = claimers[n].execute(CLAIM, {"queue": f"keys-{n}"}, prepare=True).fetchone()
                        if row is None:
                            raise RuntimeError(f"{n} keys: nothing to claim at sample {i}")
                        if i >= WARMUP:
                            times[n].append(watch.ms)
                        finisher.execute("SELECT treadle.complete(%s, %s)", row, prepare=True)
                for n in cases:
                    figures.setdefault((n, 50), []).append(percentile(times[n], 50))
                    figures.setdefault((n, 99), []).append(percentile(times[n], 99))
                    before, after = cpu_at.get(n), cpu_seconds(pids[n])
                    if before is not None and after is not None:
                        figures.setdefault((n, 0), []).append((after - before) * 1e6 / samples)
        finally:
            for conn in claimers.values():
                conn.close()
    return figures


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--heavy", type=int, default=10_000)
    p.add_argument("--light-keys", type=int, default=10)
    p.add_argument("--light-jobs", type=int, default=10)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--hold-ms", type=float, default=2.0)
    p.add_argument("--key-limit", type=int, default=2)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--active-keys", type=int, nargs="+", default=[1, 100, 10_000])
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--only", choices=["fair", "cost", "claim"], help="run one part alone")
    args = p.parse_args()
    if args.smoke:
        args.heavy, args.light_keys, args.light_jobs, args.calls = 300, 3, 3, 100
        args.active_keys, args.samples = [1, 100], 30
    counts = sorted(set(args.active_keys))
    parts = [args.only] if args.only else ["fair", "cost", "claim"]

    with server() as url, database(url, "keys") as db:
        print_settings(db)
        fair: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        cost: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for run in range(args.runs):
            for keyed in (True, False) if "fair" in parts else ():
                progress(f"fair share, {'key_limit' if keyed else 'FIFO'}: run {run + 1}/{args.runs}")
                fair[keyed].append(fair_share_run(db, keyed, args))
            for keyed in (True, False) if "cost" in parts else ():
                progress(f"cost, {'a key each' if keyed else 'no key'}: run {run + 1}/{args.runs}")
                cost[keyed].append(cost_run(db, keyed, args.calls))
        claims = claim_cost(db, counts, args.samples, args.runs) if "claim" in parts else {}

    if "fair" in parts:
        fair_table(fair, args)
    if "cost" in parts:
        cost_table(cost, args)
    if "claim" in parts:
        claim_table(claims, counts, args)


def claim_table(claims: dict[tuple[int, int], list[float]], counts: list[int], args: Any) -> None:
    rows = []
    for n in [0, *counts]:
        p50, p99, cpu = claims[(n, 50)], claims[(n, 99)], claims.get((n, 0), [])
        rows.append(
            [
                "no keys" if n == 0 else f"{n:,}",
                spread(p50, 3),
                paired_ratio(p50, claims[(0, 50)]),
                spread(p99, 3),
                paired_ratio(p99, claims[(0, 99)]),
                spread(cpu, 0) if cpu else "-",
                paired_ratio(cpu, claims.get((0, 0), [])) if cpu and claims.get((0, 0)) else "-",
            ]
        )
    table(
        "Concurrency keys: the claim of a queue with active keys, against a queue without",
        ("active keys", "p50 ms", "x no keys", "p99 ms", "x no keys", "server CPU µs/claim", "x no keys"),
        rows,
        [f"Each key holds a released job and at least 2 blocked behind it (key_limit 1); one job per claim, "
         f"completed on another connection; {args.samples} claims per run and case, the cases interleaved sample "
         f"by sample; {runs_text(args.runs)}: median (range) of the runs' figures."],
    )  # fmt: skip


def fair_table(fair: dict[bool, list[tuple[float, float]]], args: Any) -> None:
    table(
        TITLE,
        ("case", "light jobs: median s from enqueue to start", "worst s"),
        [(f"key_limit {args.key_limit}", spread([m for m, _ in fair[True]], 3), spread([w for _, w in fair[True]], 3)),
         ("FIFO, no keys", spread([m for m, _ in fair[False]], 3), spread([w for _, w in fair[False]], 3))],
        [f"{args.heavy:,} jobs of one heavy key enqueued before {args.light_keys} light keys of {args.light_jobs} "
         f"jobs; {args.workers} claimers, {fmt(args.hold_ms)} ms per job; {runs_text(args.runs)}: median (range), "
         f"the two cases alternating run by run."],
    )  # fmt: skip


def cost_table(cost: dict[bool, list[tuple[float, float]]], args: Any) -> None:
    enqueue_on, enqueue_off = [e for e, _ in cost[True]], [e for e, _ in cost[False]]
    claim_on, claim_off = [c for _, c in cost[True]], [c for _, c in cost[False]]
    table(
        "Concurrency keys: server CPU per job with a key of its own, against no key",
        ("call", "a key: µs", "no key: µs", "key / no key"),
        [("enqueue", spread(enqueue_on), spread(enqueue_off), paired_ratio(enqueue_on, enqueue_off)),
         ("claim + complete", spread(claim_on), spread(claim_off), paired_ratio(claim_on, claim_off))],
        [f"{args.calls:,} calls per run, one connection, its backend's CPU time; {runs_text(args.runs)}: median "
         f"(range), the two alternating run by run."],
    )  # fmt: skip


if __name__ == "__main__":
    main()
