"""A real worker process for the workflow fault tests (test_worker_workflow_faults.py).

    python workflow_fault_worker.py DSN WORKER_ID

It runs a treadle Worker (settings from CHILD_* environment variables, as child_worker.py)
with two workflows whose step handlers each take CHILD_STEP_SECONDS:
  "everything"  a graph: start; then at once left, right, each (a map over start's 20
                elements), nap (a sleep step of an hour), approve (a wait for the signal
                "approved") and kid (a child run of "kidflow": k1 then k2); join after
                left, right and each
  "doomed"      reserve, debit, then credit, which fails for good: the compensations
                release and refund undo reserve and debit
Each handler records 'ran' in `effects` (autocommit, so a handler killed before its
completion leaves its row), then writes (run, step, element, attempt, job, worker) to
`completions` and completes the job with ctx.complete_in on the same connection: a row
in `completions` is there exactly when the step's completion committed.

CHILD_KILLS (comma separated) names where a worker SIGKILLs itself: `mid:POINT` inside the
handler after its 'ran' row, `after:POINT` once its completion is committed, before the
handler returns. POINT is a step name, or `each/N` for element N of the map. Each fires
once across all workers: the first to reach it claims it in the table `kills` (an `after`
point in the completion's own transaction).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg

from treadle import Child, Compensation, Discard, JobContext, Sleep, Step, Wait, Worker

dsn, worker_id = sys.argv[1:3]
STEP_SECONDS = float(os.environ.get("CHILD_STEP_SECONDS", "0.2"))
ELEMENTS = 20
KILLS = set(filter(None, os.environ.get("CHILD_KILLS", "").split(",")))


def setting(name: str, default: float) -> float:
    return float(os.environ.get(f"CHILD_{name}", default))


def connect(autocommit: bool) -> psycopg.Connection[Any]:
    # named, so a test can terminate the handlers' own backends too
    return psycopg.connect(dsn, autocommit=autocommit, application_name=f"treadle-step:{worker_id}")


def claim_kill(conn: psycopg.Connection[Any], when: str, step: str | None, element: int | None) -> bool:
    """Whether `when:point` is a kill point no worker has reached yet; if so, it is this one's
    once `conn`'s transaction commits."""
    point = f"{when}:{step}" if element is None else f"{when}:{step}/{element}"
    if point not in KILLS:
        return False
    claimed = conn.execute(
        "INSERT INTO kills (point, worker) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1", [point, worker_id]
    ).fetchone()
    return claimed is not None


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def step(name: str, result: Any = None):  # type: ignore[no-untyped-def]
    def run(input: Any, ctx: JobContext) -> Any:
        element = ctx.args.get("index") if isinstance(ctx.args, dict) else None
        with connect(autocommit=True) as conn:
            conn.execute(
                "INSERT INTO effects (job_id, step, attempt, worker, what) VALUES (%s, %s, %s, %s, 'ran')",
                [ctx.job_id, ctx.step, ctx.attempt, worker_id],
            )
            if claim_kill(conn, "mid", ctx.step, element):  # (autocommit: claimed at once)
                die()
        time.sleep(STEP_SECONDS)
        value = result(input, ctx) if callable(result) else {"step": name, "by": worker_id}
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
            dies = claim_kill(conn, "after", ctx.step, element)
            ctx.complete_in(conn, value)
        if dies:
            die()
        return None

    return run


def credit(input: Any, ctx: JobContext) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO effects (job_id, step, attempt, worker, what) VALUES (%s, %s, %s, %s, 'ran')",
            [ctx.job_id, ctx.step, ctx.attempt, worker_id],
        )
    time.sleep(STEP_SECONDS)
    raise Discard("the receiving account is closed")


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(threadName)s %(levelname)s %(message)s"
    )
    worker = Worker(
        dsn,
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
    worker.run()
    print(f"worker {worker_id} exited cleanly", file=sys.stderr)


if __name__ == "__main__":
    main()
