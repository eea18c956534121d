"""Scenario, Citus: the worker's claim and finish on a Citus cluster against one server.

On one machine a cluster cannot be faster than one server (the nodes share its cores), so
this measures what carries over to a real cluster: the cost of each call of the worker's
loop through the coordinator against the same call on a single server, in the same run.
Each cycle is what the Python worker sends: `treadle.claim` of one job under the worker's
lease token, then `treadle.complete_many` of it with its queue (`job_queues`), the queues
taken in turn (8 of them, spread over the worker nodes' shards). Reported: p50 wall time
of each call from this client, and the server CPU per cycle of the backend that ran it
(/proc/PID/schedstat: on Citus the coordinator's backend only; the worker nodes' work is
not in it). The two sides alternate block by block, the first side switching every run,
and the ratio is taken run by run. A last pass on the cluster counts the statements of
the loop that ran on more than one shard (Citus's multi_task_query_log_level), which
should be none.

    .build/venv/bin/python bench/citus.py [--cycles 400] [--runs 3] [--citus URL]

--citus URL: a database on a Citus coordinator where treadle is created and distributed.
Without it the script starts a coordinator and two worker nodes with scripts/citus-cluster
on PG_CONFIG's server, which must have Citus and treadle installed (make test-citus builds
such a copy under .build/citus/pg), and stops them at the end. The single server is
DATABASE_URL or a throwaway cluster (bench/README.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    ROOT,
    database,
    fmt,
    paired_ratio,
    parser,
    percentile,
    print_settings,
    progress,
    server,
    spread,
    table,
)

TITLE = "Citus: the worker's claim and finish through the coordinator, against one server"
QUEUES = 8
CLAIM = "SELECT id FROM treadle.claim('bench', ARRAY[%s], batch => 1, lease_token => %s)"
COMPLETE = "SELECT state FROM treadle.complete_many(%s, %s, NULL, %s)"


def backend_cpu_ns(pid: int) -> int:
    """Nanoseconds a backend of this machine has run on a CPU (/proc/PID/schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


@contextmanager
def citus_database(url: str | None) -> Iterator[str]:
    """A database where treadle is distributed: the one given, or one on a cluster started here."""
    if url:
        yield url
        return
    folder = ROOT / ".build" / "bench-cluster" / f"citus-{os.getpid()}"
    script = str(ROOT / "scripts" / "citus-cluster")
    progress(f"starting a Citus coordinator and two worker nodes in {folder}")
    subprocess.run([script, "start", str(folder)], check=True, stdout=subprocess.DEVNULL)
    try:
        db = subprocess.run([script, "createdb", str(folder), "treadle_bench_citus"], check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION treadle")
            conn.execute("SELECT treadle.distribute()")
        yield db
    finally:
        subprocess.run([script, "stop", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def fill(conn: psycopg.Connection[Any], queues: list[str], count: int) -> None:
    for i in range(count):
        conn.execute("SELECT treadle.enqueue('bench', '{}', queue => %s)", [queues[i % len(queues)]])


def cycles(conn: psycopg.Connection[Any], queues: list[str], count: int) -> dict[str, Any]:
    """count claim + complete_many cycles; wall times (ms) per call, server CPU (us) per cycle."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    token = uuid.uuid4()
    claim_ms: list[float] = []
    complete_ms: list[float] = []
    cpu = backend_cpu_ns(pid)
    done = 0
    for i in range(count):
        queue = queues[i % len(queues)]
        started = time.perf_counter()
        rows = conn.execute(CLAIM, [queue, token]).fetchall()
        claim_ms.append((time.perf_counter() - started) * 1000)
        if not rows:
            continue
        started = time.perf_counter()
        conn.execute(COMPLETE, [[rows[0][0]], [token], [queue]]).fetchall()
        complete_ms.append((time.perf_counter() - started) * 1000)
        done += 1
    cpu_us = (backend_cpu_ns(pid) - cpu) / 1000 / max(done, 1)
    return {"claim": percentile(claim_ms, 50), "complete": percentile(complete_ms, 50), "cpu": cpu_us, "done": done}


def multi_shard_statements(url: str, queues: list[str], count: int) -> int:
    """Statements of count cycles that Citus ran on more than one shard."""
    notices: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        fill(conn, queues, count)
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("SET citus.multi_task_query_log_level = 'notice'")
        cycles(conn, queues, count)
    return sum("multi-task" in n for n in notices)


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--cycles", type=int, default=400, help="claim + complete cycles per side and run (default 400)")
    p.add_argument("--citus", help="a coordinator's database where treadle is distributed (default: start a cluster)")
    args = p.parse_args()
    count = 20 if args.smoke else args.cycles
    results: dict[str, list[dict[str, Any]]] = {"single": [], "citus": []}
    with server() as single_server, database(single_server, "citus") as single, citus_database(args.citus) as citus:
        print_settings(single)
        urls = {"single": single, "citus": citus}
        for run in range(args.runs):
            queues = [f"b{run}x{uuid.uuid4().hex[:6]}{i}" for i in range(QUEUES)]
            order = ["single", "citus"] if run % 2 == 0 else ["citus", "single"]
            for side in order:
                with psycopg.connect(urls[side], autocommit=True) as conn:
                    fill(conn, queues, count)
                    cycles(conn, queues, 10)  # (plans made, connections to the nodes opened)
                    fill(conn, queues, 10)
                    results[side].append(cycles(conn, queues, count))
                progress(f"run {run + 1}, {side}: {results[side][-1]}")
        multi = multi_shard_statements(citus, [f"m{uuid.uuid4().hex[:6]}{i}" for i in range(QUEUES)], count)
    rows = []
    for key, label, unit in (("claim", "claim, p50", "ms"), ("complete", "complete_many, p50", "ms"),
                             ("cpu", "server CPU per cycle (coordinator's backend)", "us")):  # fmt: skip
        single_values = [r[key] for r in results["single"]]
        citus_values = [r[key] for r in results["citus"]]
        rows.append([f"{label} ({unit})", spread(single_values), spread(citus_values),
                     paired_ratio(citus_values, single_values)])  # fmt: skip
    table(
        TITLE,
        ["", "one server", "Citus (coordinator + 2 nodes)", "Citus / one server"],
        rows,
        [f"{count} cycles over {QUEUES} queues, {args.runs} runs.",
         f"Statements of the loop run on more than one shard: {multi} in {count} cycles.",
         f"Cycles that found a job: {fmt(min(r['done'] for r in results['citus']), 0)} or more of {count} on Citus."],
    )  # fmt: skip


if __name__ == "__main__":
    main()
