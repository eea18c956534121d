"""Workflows in a worker: steps run in order with earlier results, a failing step fails the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.worker.worker_support import run_steps, start_workflow, until_run_finished
from treadle import JobContext, Step, Worker

MakeWorker = Callable[..., Worker]


def test_three_steps_pass_their_results_along(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    calls: list[tuple[str, Any, dict[str, Any], str | None, int | None]] = []

    def reserve(input: dict[str, Any], results: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        calls.append(("reserve", input, results, ctx.step, ctx.run_id))
        return {"hold": f"H-{input['order']}"}

    async def charge(input: dict[str, Any], results: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        calls.append(("charge", input, results, ctx.step, ctx.run_id))
        return {"ref": results["reserve"]["hold"] + "/paid"}

    def settle(input: dict[str, Any], results: dict[str, Any], ctx: JobContext) -> None:
        calls.append(("settle", input, results, ctx.step, ctx.run_id))

    worker.workflow("withdraw", [Step("reserve", reserve), ("charge", charge), Step("settle", settle)])
    worker.start()
    # the worker recorded the definition, so a run may name the workflow alone
    assert conn.execute("SELECT steps FROM treadle.workflows WHERE name = 'withdraw'").fetchone() == (
        ["reserve", "charge", "settle"],
    )
    run_id = start_workflow(conn, "withdraw", {"order": 42})

    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"] == {"reserve": {"hold": "H-42"}, "charge": {"ref": "H-42/paid"}, "settle": None}
    assert calls == [
        ("reserve", {"order": 42}, {}, "reserve", run_id),
        ("charge", {"order": 42}, {"reserve": {"hold": "H-42"}}, "charge", run_id),
        ("settle", {"order": 42}, {"reserve": {"hold": "H-42"}, "charge": {"ref": "H-42/paid"}}, "settle", run_id),
    ]
    assert [(s["name"], s["step"], s["attempt"]) for s in run_steps(conn, run_id)] == [
        ("workflow:withdraw", "reserve", 1),
        ("workflow:withdraw", "charge", 1),
        ("workflow:withdraw", "settle", 1),
    ]


def test_a_failing_step_fails_the_run(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(backoff=lambda attempt: 0)
    later: list[str] = []

    def charge(input: Any, results: Any, ctx: JobContext) -> None:
        raise RuntimeError("card declined")

    worker.workflow(
        "withdraw",
        [("reserve", lambda i, r, c: "held"), ("charge", charge), ("settle", lambda i, r, c: later.append("settle"))],
    )
    row = conn.execute(
        "SELECT treadle.start_workflow('withdraw', %s, %s, max_attempts => 2)",
        [Jsonb({}), ["reserve", "charge", "settle"]],
    ).fetchone()
    assert row is not None
    run_id = row[0]
    worker.start()

    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "failed"
    assert finished["results"] == {"reserve": "held"}
    steps = run_steps(conn, run_id)
    assert [(s["step"], s["state"], s["attempt"]) for s in steps] == [
        ("reserve", "completed", 1),
        ("charge", "discarded", 2),
    ]
    assert "RuntimeError: card declined" in steps[1]["last_error"]
    assert later == []


def test_a_step_this_worker_does_not_know_fails_clearly(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.workflow("withdraw", [("reserve", lambda i, r, c: 1)])
    row = conn.execute(
        "SELECT treadle.start_workflow('withdraw', '{}', %s, max_attempts => 1)", [["reserve", "refund"]]
    ).fetchone()
    assert row is not None
    worker.start()
    finished = until_run_finished(conn, row[0])
    assert finished["state"] == "failed"
    refund = run_steps(conn, row[0])[1]
    assert "workflow 'withdraw' has no step 'refund' in this worker (it knows reserve)" in refund["last_error"]
