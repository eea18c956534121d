"""Scenario 4, storm: many concurrent enqueues of one idempotency key.

The requests run on as many connections as the server allows (the rest wait
for a free one), all released at once. Reports the rows created with the key
(it must be 1), whether every caller got the same id, and the time until the
last caller had its answer. The raw baseline does the same with a hand-written
INSERT ... ON CONFLICT DO NOTHING, then a SELECT when the key was taken.

    .build/venv/bin/python bench/storm.py [--requests 1000] [--runs 3]
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from harness import (
    database,
    fmt,
    median,
    paired_ratio,
    parser,
    print_settings,
    progress,
    runs_text,
    server,
    spread,
    table,
)

TITLE = "Storm: concurrent enqueues of one idempotency key"
TREADLE_ENQUEUE = "SELECT treadle.enqueue('bench', '{}', idempotency_key => %(key)s)"
RAW_INSERT = """
INSERT INTO bench_raw.jobs (queue, name, args, run_at, created_at, idempotency_key)
VALUES ('default', 'bench', '{}', now(), now(), %(key)s)
ON CONFLICT DO NOTHING
RETURNING id
"""
RAW_LOOKUP = "SELECT id FROM bench_raw.jobs WHERE queue = 'default' AND idempotency_key = %(key)s"

Conn = psycopg.AsyncConnection[Any]


async def treadle_enqueue(conn: Conn, key: str) -> int | None:
    cur = await conn.execute(TREADLE_ENQUEUE, {"key": key})
    row = await cur.fetchone()
    return None if row is None else row[0]


async def raw_enqueue(conn: Conn, key: str) -> int | None:
    row = await (await conn.execute(RAW_INSERT, {"key": key})).fetchone()
    if row is None:  # taken: by a committed row, or one whose insert we waited for
        row = await (await conn.execute(RAW_LOOKUP, {"key": key})).fetchone()
    return None if row is None else row[0]


async def storm(conns: list[Conn], requests: int, enqueue: Callable[[Conn, str], Awaitable[int | None]],
                table_name: str) -> tuple[float, int, int]:
    """Milliseconds until every request answered, rows created with the key, distinct ids answered."""
    key = f"storm-{uuid.uuid4()}"
    free: asyncio.Queue[Conn] = asyncio.Queue()
    for c in conns:
        free.put_nowait(c)

    async def one() -> int | None:
        conn = await free.get()
        try:
            return await enqueue(conn, key)
        finally:
            free.put_nowait(conn)

    start = time.perf_counter()
    ids = await asyncio.gather(*(one() for _ in range(requests)))
    elapsed = (time.perf_counter() - start) * 1000
    cur = await conns[0].execute(f"SELECT count(*) FROM {table_name} WHERE idempotency_key = %s", [key])
    row = await cur.fetchone()
    return elapsed, row[0] if row else 0, len(set(ids))


async def connection_budget(url: str, wanted: int) -> int:
    """How many more connections the server accepts, keeping a few spare for others."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')")
        row = await cur.fetchone()
    free = (row[0] if row else 10) - 5
    return max(1, min(wanted, free))


async def run(url: str, requests: int, runs: int) -> tuple[int, dict[str, list[float]]]:
    n = await connection_budget(url, requests)
    progress(f"opening {n} connections")
    conns = list(await asyncio.gather(*(psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(n))))
    f: dict[str, list[float]] = {k: [] for k in ("t_ms", "t_rows", "t_ids", "r_ms", "r_rows", "r_ids")}
    try:
        # warm every connection's caches once, apart from the timed storms
        await asyncio.gather(*(treadle_enqueue(c, f"warm-{uuid.uuid4()}") for c in conns))
        await asyncio.gather(*(raw_enqueue(c, f"warm-{uuid.uuid4()}") for c in conns))
        for i in range(runs):
            progress(f"run {i + 1}/{runs}: {requests} requests on {n} connections, each side")
            sides = [("t", treadle_enqueue, "treadle.jobs"), ("r", raw_enqueue, "bench_raw.jobs")]
            for side, enqueue, table_name in (sides if i % 2 == 0 else sides[::-1]):
                ms, rows, ids = await storm(conns, requests, enqueue, table_name)
                f[f"{side}_ms"].append(ms)
                f[f"{side}_rows"].append(rows)
                f[f"{side}_ids"].append(ids)
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    return n, f


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--requests", type=int, default=1000, help="concurrent enqueues of the key (default 1000)")
    args = p.parse_args()
    requests = 50 if args.smoke else args.requests
    with server() as url, database(url, "storm") as db:
        print_settings(db)
        n, f = asyncio.run(run(db, requests, args.runs))

    def counts(values: list[float]) -> str:
        return ", ".join(str(int(v)) for v in values)

    table(
        TITLE,
        ["side", "rows created (each run)", "distinct ids answered", "time ms", "ratio"],
        [["treadle.enqueue", counts(f["t_rows"]), counts(f["t_ids"]), spread(f["t_ms"], 1),
          paired_ratio(f["t_ms"], f["r_ms"])],
         ["raw INSERT ON CONFLICT + SELECT", counts(f["r_rows"]), counts(f["r_ids"]), spread(f["r_ms"], 1), "1.00"]],
        notes=[f"{requests} requests per run on {n} connections, {runs_text(args.runs)}; time: median (range), "
               f"from release to the last answer. Goal: exactly 1 row "
               f"({'met' if all(v == 1 for v in f['t_rows']) else 'NOT met'}); "
               f"treadle median {fmt(median(f['t_ms']), 1)} ms."],
    )


if __name__ == "__main__":
    main()
