"""Per-step options with real workers: a step in its own queue runs on a worker of that
queue, a step's own max_attempts and backoff hold, and start_workflow's step_options."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle
from tests.worker.worker_support import run, run_steps, start_workflow, until_run_finished, wait_for
from treadle import Compensation, Discard, InvalidArgument, JobContext, Step, Worker

MakeWorker = Callable[..., Worker]


def _steps(done: list[str]) -> list[Step]:
    def fetch(input: Any, ctx: JobContext) -> str:
        done.append("fetch")
        return "raw"

    def render(input: Any, ctx: JobContext) -> str:
        done.append("render")
        return f"rendered {ctx.results['fetch']}"

    return [
        Step("fetch", fetch),
        Step("render", render, queue="gpu", priority=5, timeout=timedelta(minutes=10)),
    ]


def test_a_step_in_its_own_queue_runs_on_a_worker_of_that_queue(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    done: list[str] = []
    cpu = make_worker(queues=["default"], worker_id="cpu-worker")
    cpu.workflow("frames", _steps(done))
    cpu.start()
    run_id = wait_for(lambda: _start(conn, "frames"), "the definition to be recorded")
    render_job = wait_for(
        lambda: next((s for s in run_steps(conn, run_id) if s["step"] == "render"), None), "the render step job"
    )
    assert (render_job["queue"], render_job["priority"], render_job["timeout"]) == ("gpu", 5, timedelta(minutes=10))
    assert done == ["fetch"]
    # the worker of the run's queue leaves it: it does not work queue gpu
    assert render_job["state"] == "available"

    gpu = make_worker(queues=["gpu"], worker_id="gpu-worker")
    gpu.workflow("frames", _steps(done))
    gpu.start()
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"]["render"] == "rendered raw"
    assert {s["step"]: (s["queue"], s["worker_id"]) for s in run_steps(conn, run_id)} == {
        "fetch": ("default", "cpu-worker"),
        "render": ("gpu", "gpu-worker"),
    }


def _start(conn: psycopg.Connection[Any], name: str) -> int | None:
    if conn.execute("SELECT 1 FROM treadle.workflows WHERE name = %s", [name]).fetchone() is None:
        return None
    return start_workflow(conn, name, {})


def test_a_steps_max_attempts_and_backoff_hold(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    attempts: list[int] = []

    def charge(input: Any, ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        raise ConnectionError("payment provider down")

    worker.workflow(
        "pay",
        [
            Step("reserve", lambda i, ctx: "held"),
            Step("charge", charge, max_attempts=3, backoff=[timedelta(0)]),
        ],
    )
    worker.start()
    run_id = wait_for(lambda: _start(conn, "pay"), "the definition to be recorded")
    finished = until_run_finished(conn, run_id)
    assert (finished["state"], finished["max_attempts"]) == ("failed", 25)
    steps = {s["step"]: s for s in run_steps(conn, run_id)}
    assert (steps["charge"]["state"], steps["charge"]["attempt"], steps["charge"]["max_attempts"]) == (
        "discarded",
        3,
        3,
    )
    assert steps["charge"]["backoff"] == [timedelta(0)]
    assert attempts == [1, 2, 3]
    assert steps["reserve"]["max_attempts"] == 25


def test_a_compensations_options_hold(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(queues=["default", "refunds"])

    def settle(input: Any, ctx: JobContext) -> None:
        raise Discard("the bank refused")

    worker.workflow(
        "withdrawal",
        [
            Step("reserve", lambda i, ctx: {"hold": "h-1"}),
            Step("settle", settle),
            Compensation("release", lambda i, ctx: "released", undoes="reserve", queue="refunds", max_attempts=4),
        ],
    )
    worker.start()
    run_id = wait_for(lambda: _start(conn, "withdrawal"), "the definition to be recorded")
    finished = wait_for(
        lambda: (row := run(conn, run_id))["state"] in ("compensated", "failed") and row, "the run to end"
    )
    assert finished["state"] == "compensated"
    steps = {s["step"]: s for s in run_steps(conn, run_id)}
    assert (steps["release"]["queue"], steps["release"]["max_attempts"], steps["release"]["state"]) == (
        "refunds",
        4,
        "completed",
    )
    assert (steps["reserve"]["queue"], steps["reserve"]["max_attempts"]) == ("default", 25)


def test_start_workflow_takes_step_options(conn: psycopg.Connection[Any]) -> None:
    run_id = treadle.start_workflow(
        conn,
        "ad-hoc",
        steps=["a", "b"],
        queue="main",
        step_options={"a": {"queue": "side", "max_attempts": 4, "backoff": [timedelta(seconds=1)]}},
    )
    assert run(conn, run_id)["step_options"] == {"a": {"queue": "side", "max_attempts": 4, "backoff": ["00:00:01"]}}
    (first,) = run_steps(conn, run_id)
    assert (first["queue"], first["max_attempts"], first["backoff"]) == ("side", 4, [timedelta(seconds=1)])


def test_bad_step_options_are_refused(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    with pytest.raises(InvalidArgument, match="unknown option 'prio'"):
        treadle.start_workflow(conn, "x", steps=["a"], step_options={"a": {"prio": 1}})
    with pytest.raises(InvalidArgument, match="max_attempts must be between 1 and"):
        treadle.start_workflow(conn, "x", steps=["a"], step_options={"a": {"max_attempts": 0}})
    with pytest.raises(InvalidArgument, match=r"timeout.*at most 7 days"):  # 22023 from the database
        treadle.start_workflow(conn, "x", steps=["a"], step_options={"a": {"timeout": timedelta(days=8)}})
    with pytest.raises(InvalidArgument, match="queue"):
        make_worker().workflow("y", [Step("a", lambda i, ctx: None, queue="")])
    assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == (0,)


def test_a_keyed_step_runs_one_at_a_time_over_every_run(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    lock = threading.Lock()
    inside = [0, 0]  # now, most at once

    def render(input: Any, ctx: JobContext) -> str:
        with lock:
            inside[0] += 1
            inside[1] = max(inside[1], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        return "done"

    worker = make_worker(concurrency=4)
    worker.workflow("frames", [Step("fetch", lambda i, ctx: "raw"), Step("render", render, concurrency_key="gpu-0")])
    worker.start()
    first = wait_for(lambda: _start(conn, "frames"), "the definition to be recorded")
    run_ids = [first] + [start_workflow(conn, "frames", {}) for _ in range(3)]
    for run_id in run_ids:
        assert until_run_finished(conn, run_id)["state"] == "completed"
    assert inside[1] == 1, "the key's limit (1) held across runs"
    keys = conn.execute(
        "SELECT step, concurrency_key FROM treadle.jobs WHERE workflow_run_id = ANY(%s) ORDER BY id", [run_ids]
    ).fetchall()
    assert sorted(set(keys)) == [("fetch", None), ("render", "gpu-0")]
    with pytest.raises(InvalidArgument, match="concurrency_key must be a string"):
        treadle.start_workflow(conn, "x", steps=["a"], step_options={"a": {"concurrency_key": 5}})
    with pytest.raises(InvalidArgument, match="concurrency_key"):  # 22023 from the database
        treadle.start_workflow(conn, "x", steps=["a"], step_options={"a": {"concurrency_key": " "}})
