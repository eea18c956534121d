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

    .build/venv/bin/python bench/keys.py [--heavy 10000] [--light-keys 10] [--light-jobs 10]
                                         [--workers 4] [--hold-ms 2] [--key-limit 2] [--calls 2000] [--runs 3]
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from harness import (
    cpu_seconds,
    database,
    fmt,
    median,
    paired_ratio,
    parser,
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


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--heavy", type=int, default=10_000)
    p.add_argument("--light-keys", type=int, default=10)
    p.add_argument("--light-jobs", type=int, default=10)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--hold-ms", type=float, default=2.0)
    p.add_argument("--key-limit", type=int, default=2)
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    if args.smoke:
        args.heavy, args.light_keys, args.light_jobs, args.calls = 300, 3, 3, 100

    with server() as url, database(url, "keys") as db:
        print_settings(db)
        fair: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        cost: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for run in range(args.runs):
            for keyed in (True, False):
                progress(f"fair share, {'key_limit' if keyed else 'FIFO'}: run {run + 1}/{args.runs}")
                fair[keyed].append(fair_share_run(db, keyed, args))
            for keyed in (True, False):
                progress(f"cost, {'a key each' if keyed else 'no key'}: run {run + 1}/{args.runs}")
                cost[keyed].append(cost_run(db, keyed, args.calls))

    table(
        TITLE,
        ("case", "light jobs: median s from enqueue to start", "worst s"),
        [(f"key_limit {args.key_limit}", spread([m for m, _ in fair[True]], 3), spread([w for _, w in fair[True]], 3)),
         ("FIFO, no keys", spread([m for m, _ in fair[False]], 3), spread([w for _, w in fair[False]], 3))],
        [f"{args.heavy:,} jobs of one heavy key enqueued before {args.light_keys} light keys of {args.light_jobs} "
         f"jobs; {args.workers} claimers, {fmt(args.hold_ms)} ms per job; {runs_text(args.runs)}: median (range), "
         f"the two cases alternating run by run."],
    )  # fmt: skip
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
