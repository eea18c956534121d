"""A real worker process for the crash and fault tests.

    python child_worker.py DSN WORKER_ID KILL_AT

It runs a treadle Worker (settings from CHILD_* environment variables) with:
  record(args)      records an effect, then works for args["seconds"] (a number, or
                    a map from worker id to a number), looking at ctx.cancelled and
                    recording 'aborted' when it fires; returns {"by": WORKER_ID, "attempt": n}
  tick(args)        returns at once (quick: such handlers run on the completer's thread);
                    with args["hang"], records an effect and sleeps that many seconds
                    without looking at ctx.cancelled
  misbehave(args)   does what args["do"] names (see MISDEEDS): raises a BaseException,
                    returns a value JSON cannot hold, or an object of no JSON kind
  amisbehave(args)  misbehave as an async handler
  hang(args)        records an effect, then sleeps args["seconds"] without looking at
                    ctx.cancelled; registered with timeout=CHILD_HANG_TIMEOUT seconds
  workflow "trip"   steps reserve, charge, notify; each records an effect and returns
                    {"step": name, "by": WORKER_ID, "seen": [earlier steps]}
  workflow "long"   one step, work, that works as record does (its input is record's args)
  workflow "fork"   a graph: left and right at once, join after both; steps as trip's
  workflow "deploy" (with CHILD_DEPLOY=old or new) the old definition [a, b] or the new
                    one [a, b2, c] with c after a only; steps as trip's
Effects and the events lease_lost and released (or those CHILD_EVENTS lists, comma
separated) go to the table `effects`.

KILL_AT picks where the process stops itself:
  none                         never
  after_claim                  SIGKILL when a job is claimed, before its handler
  in_handler                   SIGKILL inside record, after its effect
  during_completion            SIGKILL when a handler returned, before its completion is written
  step_after_effect:STEP       SIGKILL inside step STEP, after its effect
  after_step_stored:STEP       SIGKILL once step STEP's result is committed
  stop_before_complete         SIGSTOP (once) when a handler returned, before its completion
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import psycopg

from treadle import JobContext, Step, Worker
from treadle.worker import WorkerEvent

dsn, worker_id, kill_at = sys.argv[1:4]
stopped_once = False
RECORDED_EVENTS = set(os.environ.get("CHILD_EVENTS", "lease_lost,released").split(","))


def setting(name: str, default: float) -> float:
    return float(os.environ.get(f"CHILD_{name}", default))


def record(source: JobContext | WorkerEvent, what: str) -> None:
    """One row in `effects` for the job that `source` (a context or an event) is about."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO effects (job_id, step, attempt, worker, what) VALUES (%s, %s, %s, %s, %s)",
            [source.job_id, source.step, source.attempt, worker_id, what],
        )


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def record_handler(args: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    record(ctx, "ran")
    if kill_at == "in_handler":
        die()
    seconds = args.get("seconds", 0)
    if isinstance(seconds, dict):  # per worker: {"zombie": 3600} works long only in the zombie
        seconds = seconds.get(worker_id, 0)
    until = time.monotonic() + float(seconds)
    while time.monotonic() < until:
        if ctx.cancelled.is_set():
            record(ctx, "aborted")
            ctx.check_cancelled()
        time.sleep(0.02)
    return {"by": worker_id, "attempt": ctx.attempt}


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _raise(error: BaseException) -> Any:
    raise error


def _generator() -> Any:
    yield 1


class UnprintableError(Exception):
    """An exception whose message cannot be read: its __str__ raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


MISDEEDS: dict[str, Any] = {
    "keyboard_interrupt": lambda: _raise(KeyboardInterrupt()),
    "system_exit": lambda: _raise(SystemExit(3)),
    "generator_exit": lambda: _raise(GeneratorExit()),
    "long_error": lambda: _raise(ValueError("head " + "x" * 100_000 + " tail")),
    "unprintable": lambda: _raise(UnprintableError()),
    "set": lambda: {1, 2},
    "int_keys": lambda: {1: "one"},
    "nan": lambda: {"ratio": float("nan")},
    "deep_list": lambda: deep_list(10_000),
    "object": lambda: object(),
    "generator": _generator,
}


def hang(args: dict[str, Any], ctx: JobContext) -> None:
    record(ctx, "ran")
    time.sleep(float(args["seconds"]))


def tick(args: dict[str, Any], ctx: JobContext) -> None:
    if "hang" in args:
        record(ctx, "ran")
        time.sleep(float(args["hang"]))


def misbehave(args: dict[str, Any], ctx: JobContext) -> Any:
    record(ctx, "ran")
    return MISDEEDS[args["do"]]()


async def amisbehave(args: dict[str, Any], ctx: JobContext) -> Any:
    record(ctx, "ran")
    return MISDEEDS[args["do"]]()


def step(name: str):  # type: ignore[no-untyped-def]
    def run(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        record(ctx, "ran")
        if kill_at == f"step_after_effect:{name}":
            die()
        return {"step": name, "by": worker_id, "seen": sorted(ctx.results), "input": input}

    return run


def on_event(event: WorkerEvent) -> None:
    global stopped_once
    if event.kind in RECORDED_EVENTS:
        record(event, event.kind)
    if kill_at == "after_claim" and event.kind == "claimed":
        die()
    if kill_at == "during_completion" and event.kind == "completing":
        die()
    if kill_at == f"after_step_stored:{event.step}" and event.kind == "completed":
        die()
    if kill_at == "stop_before_complete" and event.kind == "completing" and not stopped_once:
        stopped_once = True
        # Sent to this thread, not the process: a process-directed stop may be taken
        # by another thread first, and this one would run on and write its completion.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(threadName)s %(levelname)s %(message)s"
    )
    worker = Worker(
        dsn,
        concurrency=int(setting("CONCURRENCY", 2)),
        worker_id=worker_id,
        lease=setting("LEASE", 1.0),
        heartbeat_interval=setting("HEARTBEAT", 0.2),
        rescue_interval=setting("RESCUE", 0.2),
        poll_interval=setting("POLL", 0.2),
        stop_timeout=setting("STOP_TIMEOUT", 5.0),
        retention_interval=None if os.environ.get("CHILD_RETENTION") == "off" else setting("RETENTION", 60.0),
        retention_batch=int(setting("RETENTION_BATCH", 1000)),
        on_event=on_event,
    )
    worker.register("record", record_handler)
    worker.register("misbehave", misbehave)
    worker.register("tick", tick)
    worker.register("amisbehave", amisbehave)
    worker.register("hang", hang, timeout=setting("HANG_TIMEOUT", 3600))
    worker.workflow(
        "trip", [Step("reserve", step("reserve")), Step("charge", step("charge")), ("notify", step("notify"))]
    )
    worker.workflow("long", [Step("work", record_handler)])  # a step that works as record does
    worker.workflow(
        "fork",
        [
            Step("left", step("left"), after=[]),
            Step("right", step("right"), after=[]),
            Step("join", step("join"), after=["left", "right"]),
        ],
    )
    deploy = os.environ.get("CHILD_DEPLOY")
    if deploy == "old":
        worker.workflow("deploy", [Step("a", step("a")), Step("b", step("b"))])
    elif deploy == "new":
        worker.workflow(
            "deploy",
            [Step("a", step("a"), after=[]), Step("b2", step("b2"), after=["a"]), Step("c", step("c"), after=["a"])],
        )
    worker.run()
    print(f"worker {worker_id} exited cleanly", file=sys.stderr)


if __name__ == "__main__":
    main()
