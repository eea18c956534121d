"""A treadle.Worker in a process of its own, driven by a benchmark over its pipes.

It prints `ready` once the worker claims, then works until its stdin closes, then
stops gracefully and prints `maxrss <KiB>` (the process's peak resident size).
Handlers, all registered for the job name `bench`:
  noop    returns at once;
  async-noop  the same, as an async def;
  record  prints `start <job id> <unix time>` when it starts;
  hang    prints the same line, then sleeps (a job to kill a worker in);
  chain   enqueues the next job of a chain (args {"left": n}, to the same queue, on a
          connection of its handler thread's) while n > 0, then returns.
`--queue-count N` serves N queues, `<queue>-0` to `<queue>-<N-1>`, instead of one.
`--no-listen` turns off the LISTEN connection, so the worker only polls (what it
does where LISTEN is refused, behind PgBouncer in transaction mode). `--timeout S`
gives the handler a timeout of S seconds (its policy: every attempt is timed).
`--prepared` prepares statements on every connection (`Worker(prepared_statements=True)`),
`--unprepared` on none (`False`, what a worker gets through a pooler); without either the
worker's default (None: prepared where its connection reaches the server itself).
`--claim-ahead N` holds up to N jobs beyond the free slots (`Worker(claim_ahead=N)`; without it the
default: as many as `--concurrency` while handlers are quick).
`--names A,B,C` registers the handler for each of these job names instead of `bench` (none: `--names ''`);
`--workflow NAME:S1,S2,S3` registers a workflow of these steps, one after another, each step
the handler.

    python bench/worker_treadle.py DSN [--concurrency 10] [--handler noop] [--no-listen] ...
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from typing import Any

import psycopg

import treadle
from treadle.worker import Worker

_print_lock = threading.Lock()


def say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def noop(args: Any, ctx: Any) -> None:
    return None


async def async_noop(args: Any, ctx: Any) -> None:
    return None


def record(args: Any, ctx: Any) -> None:
    say(f"start {ctx.job_id} {time.time():.6f}")


def hang(args: Any, ctx: Any) -> None:
    say(f"start {ctx.job_id} {time.time():.6f}")
    time.sleep(3600)


_chain_dsn = ""
_chain_conn = threading.local()


def chain(args: Any, ctx: Any) -> None:
    left = int(args.get("left", 0))
    if left > 0:
        conn = getattr(_chain_conn, "conn", None)
        if conn is None:
            conn = _chain_conn.conn = psycopg.connect(_chain_dsn, autocommit=True)
        treadle.enqueue(conn, "bench", {"left": left - 1}, queue=ctx.queue)


def main() -> None:
    global _chain_dsn
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dsn")
    p.add_argument("--queue", default="default")
    p.add_argument("--queue-count", type=int, default=0, help="serve this many queues named <queue>-<i>")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--handler", choices=("noop", "async-noop", "record", "hang", "chain"), default="noop")
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--heartbeat-interval", type=float, default=10.0)
    p.add_argument("--rescue-interval", type=float, default=5.0)
    p.add_argument("--no-listen", action="store_true")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--claim-ahead", type=int, default=None)
    p.add_argument("--names", default="bench", help="the job names the handler is registered for, comma-separated")
    p.add_argument("--workflow", default=None, help="NAME:S1,S2,...: a workflow of these steps, each the handler")
    prepared = p.add_mutually_exclusive_group()
    prepared.add_argument("--prepared", dest="prepared", action="store_const", const=True, default=None)
    prepared.add_argument("--unprepared", dest="prepared", action="store_const", const=False)
    args = p.parse_args()

    queues = [f"{args.queue}-{i}" for i in range(args.queue_count)] if args.queue_count else [args.queue]
    worker = Worker(
        args.dsn, queues=queues, concurrency=args.concurrency, poll_interval=args.poll_interval,
        listen=not args.no_listen, prepared_statements=args.prepared,
        lease=args.lease, heartbeat_interval=args.heartbeat_interval, rescue_interval=args.rescue_interval,
        stop_timeout=0, claim_ahead=args.claim_ahead)
    _chain_dsn = args.dsn
    handlers = {"noop": noop, "async-noop": async_noop, "record": record, "hang": hang, "chain": chain}
    for name in filter(None, args.names.split(",")):
        worker.register(name, handlers[args.handler], timeout=args.timeout)
    if args.workflow:
        workflow, steps = args.workflow.split(":", 1)
        worker.workflow(workflow, [(step, handlers[args.handler]) for step in steps.split(",")], timeout=args.timeout)
    worker.start()
    say("ready")
    sys.stdin.read()  # until the benchmark closes the pipe
    worker.stop(immediate=True)
    say(f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")


if __name__ == "__main__":
    main()
