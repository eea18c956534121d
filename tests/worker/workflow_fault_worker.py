"""A real worker process for the workflow fault tests (test_worker_workflow_faults.py).

    python workflow_fault_worker.py DSN WORKER_ID

It runs a treadle Worker on the queues default and side (settings from CHILD_* environment
variables, as child_worker.py) with three workflows whose step handlers each take
CHILD_STEP_SECONDS:
  "everything"  a graph: start; then at once left, right, each (a map over start's 20
                elements), nap (a sleep step of an hour), approve (a wait for the signal
                "approved") and kid (a child run of "kidflow": k1 then k2); join after
                left, right and each
  "doomed"      reserve, debit, then credit, which fails for good: the compensations
                release and refund undo reserve and debit
  "ledger"      a graph of steps with their own options: at once doze (its handler
                sleeps DOZE with ctx.sleep before its work), cleared (a wait for the signal
                "cleared"), side (queue side, priority 7) and lane (concurrency key
                ledger-lane); settle (max_attempts 10) after those four; close after
                settle. settle fails for good in a run whose input says "broken" until the
                table `repaired` names the run: the test retries such a run, or forks it
Each handler records 'ran' in `effects` (autocommit, so a handler killed before its
completion leaves its row), then writes (run, step, element, attempt, job, worker) to
`completions` and completes the job with ctx.complete_in on the same connection: a row
in `completions` is there exactly when the step's completion committed. A step that
fails on purpose (credit, a broken settle) records 'refused' instead, and a handler whose
ctx.sleep ended its attempt records 'snoozed'.

CHILD_KILLS (comma separated) names where a worker SIGKILLs itself: `mid:POINT` inside the
handler after its 'ran' row, `after:POINT` once its completion is committed, before the
handler returns, `slept:POINT` once ctx.sleep has recorded the wake time, before the
worker snoozes the job. POINT is a step name, or `each/N` for element N of the map, with
`@fork` after it in a run started by fork_run (its input says "forked"). Each fires once
across all workers: the first to reach it claims it in the table `kills` (an `after` point
in the completion's own transaction).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from treadle import Child, Compensation, Discard, JobContext, Sleep, Snooze, Step, Wait, Worker

dsn, worker_id = sys.argv[1:3]
STEP_SECONDS = float(os.environ.get("CHILD_STEP_SECONDS", "0.2"))
ELEMENTS = 20
# a handler's durable sleep, waited out: workers claim by the server's clock, which a test cannot move for them
DOZE = timedelta(seconds=0.3)
KILLS = set(filter(None, os.environ.get("CHILD_KILLS", "").split(",")))

Result = Callable[[Any, JobContext], Any]


def setting(name: str, default: float) -> float:
    return float(os.environ.get(f"CHILD_{name}", default))


def connect(autocommit: bool) -> psycopg.Connection[Any]:
    # named, so a test can terminate the handlers' own backends too
    return psycopg.connect(dsn, autocommit=autocommit, application_name=f"treadle-step:{worker_id}")


def place(input: Any, ctx: JobContext) -> str:
    """Where a handler is, as kill points name it: step, step/element, and @fork in a fork."""
    element = ctx.args.get("index") if isinstance(ctx.args, dict) else None
    where = f"{ctx.step}" if element is None else f"{ctx.step}/{element}"
    return f"{where}@fork" if isinstance(input, dict) and input.get("forked") else where


def claim_kill(conn: psycopg.Connection[Any], point: str) -> bool:
    """Whether `point` is a kill point no worker has reached yet; if so, it is this one's
    once `conn`'s transaction commits."""
    if point not in KILLS:
        return False
    claimed = conn.execute(
        "INSERT INTO kills (point, worker) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1", [point, worker_id]
    ).fetchone()
    return claimed is not None


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def record(conn: psycopg.Connection[Any], ctx: JobContext, what: str) -> None:
    conn.execute(
        "INSERT INTO effects (job_id, step, attempt, worker, what) VALUES (%s, %s, %s, %s, %s)",
        [ctx.job_id, ctx.step, ctx.attempt, worker_id, what],
    )


def doze(input: Any, ctx: JobContext) -> None:
    """ctx.sleep(DOZE): the first call records the wake time and ends the attempt (Snooze)."""
    try:
        ctx.sleep(DOZE)
    except Snooze:
        with connect(autocommit=True) as conn:
            record(conn, ctx, "snoozed")
            if claim_kill(conn, f"slept:{place(input, ctx)}"):
                die()
        raise


def step(name: str, result: Result | None = None, *, sleeps: bool = False) -> Result:
    def run(input: Any, ctx: JobContext) -> None:
        if sleeps:
            doze(input, ctx)  # before the 'ran' row: a pass that only snoozes is no rerun
        element = ctx.args.get("index") if isinstance(ctx.args, dict) else None
        with connect(autocommit=True) as conn:
            record(conn, ctx, "ran")
            if claim_kill(conn, f"mid:{place(input, ctx)}"):  # (autocommit: claimed at once)
                die()
        time.sleep(STEP_SECONDS)
        value = result(input, ctx) if result is not None else {"step": name, "by": worker_id}
        with connect(autocommit=False) as conn:
            conn.execute(
                "INSERT INTO completions (run_id, step, element, attempt, job_id, worker)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [ctx.run_id, ctx.step, element, ctx.attempt, ctx.job_id, worker_id],
            )
            # claimed in the completion's transaction: a process that another thread's kill
            # point ends between this commit and its own kill has still died after it (a
            # claim made after the commit would be lost then, and a step that completed is
            # never run again to reach its point)
            dies = claim_kill(conn, f"after:{place(input, ctx)}")
            ctx.complete_in(conn, value)
        if dies:
            die()
        return None

    return run


def refuse(ctx: JobContext, reason: str, seconds: float) -> None:
    """A step that fails for good on purpose: its 'refused' row, `seconds` of work, then Discard."""
    with connect(autocommit=True) as conn:
        record(conn, ctx, "refused")
    time.sleep(seconds)
    raise Discard(reason)


def credit(input: Any, ctx: JobContext) -> None:
    refuse(ctx, "the receiving account is closed", STEP_SECONDS)


settled = step("settle")


def settle(input: Any, ctx: JobContext) -> None:
    with connect(autocommit=True) as conn:
        repaired = conn.execute("SELECT 1 FROM repaired WHERE run_id = %s", [ctx.run_id]).fetchone()
    if input.get("broken") and repaired is None:
        refuse(ctx, "the ledger is out of balance", 0)  # at once: the retry and the fork come sooner
    settled(input, ctx)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(threadName)s %(levelname)s %(message)s"
    )
    worker = Worker(
        dsn,
        queues=["default", "side"],
        concurrency=int(setting("CONCURRENCY", 4)),
        worker_id=worker_id,
        lease=setting("LEASE", 1.0),
        heartbeat_interval=setting("HEARTBEAT", 0.2),
        rescue_interval=setting("RESCUE", 0.2),
        poll_interval=setting("POLL", 0.2),
        stop_timeout=setting("STOP_TIMEOUT", 5.0),
        backoff=lambda attempt: 0,
    )
    worker.workflow("kidflow", [Step("k1", step("k1")), Step("k2", step("k2"))])
    worker.workflow(
        "everything",
        [
            Step("start", step("start", lambda input, ctx: list(range(ELEMENTS))), after=[]),
            Step("left", step("left"), after=["start"]),
            Step("right", step("right"), after=["start"]),
            Step("each", step("each", lambda input, ctx: ctx.args["element"] * 10), after=["start"], over="start"),
            Sleep("nap", timedelta(hours=1), after=["start"]),
            Wait("approve", "approved", after=["start"]),
            Child("kid", "kidflow", after=["start"]),
            Step("join", step("join", lambda input, ctx: sorted(ctx.results)), after=["left", "right", "each"]),
        ],
    )
    worker.workflow(
        "doomed",
        [
            Step("reserve", step("reserve")),
            Step("debit", step("debit")),
            Step("credit", credit),
            Compensation("release", step("release"), undoes="reserve"),
            Compensation("refund", step("refund"), undoes="debit"),
        ],
    )
    worker.workflow(
        "ledger",
        [
            Step("doze", step("doze", sleeps=True), after=[]),
            Wait("cleared", "cleared", after=[]),
            Step("side", step("side"), after=[], queue="side", priority=7),
            Step("lane", step("lane"), after=[], concurrency_key="ledger-lane"),
            Step("settle", settle, after=["doze", "cleared", "side", "lane"], max_attempts=10),
            Step("close", step("close"), after=["settle"]),
        ],
    )
    worker.run()
    print(f"worker {worker_id} exited cleanly", file=sys.stderr)


if __name__ == "__main__":
    main()
