"""A handler reads the metadata its producer stored with the job (ctx.meta, ctx.job.meta); a
workflow step reads its run's (start_workflow's meta)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

import treadle
from tests.worker.worker_support import until_run_finished, until_state
from treadle import JobContext, Worker

MakeWorker = Callable[..., Worker]


def test_a_handler_reads_meta(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    seen: dict[int, Any] = {}

    @worker.register
    def deliver(args: Any, ctx: JobContext) -> None:
        seen[ctx.job_id] = (ctx.meta, ctx.job.meta)

    with_meta = treadle.enqueue(conn, "deliver", meta={"tenant": "acme", "trace": {"id": "abc"}})
    without = treadle.enqueue(conn, "deliver")
    worker.start()
    until_state(conn, with_meta, "completed")
    until_state(conn, without, "completed")
    assert seen == {with_meta: ({"tenant": "acme", "trace": {"id": "abc"}},) * 2, without: (None, None)}


def test_steps_read_their_runs_meta(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    seen: dict[tuple[int | None, str], Any] = {}

    def step(name: str) -> Callable[[Any, JobContext], None]:
        def run_step(input: Any, ctx: JobContext) -> None:
            seen[ctx.job.workflow_run_id, name] = ctx.meta

        return run_step

    worker.workflow("onboard", [treadle.Step("create", step("create")), treadle.Step("welcome", step("welcome"))])
    run_id = treadle.start_workflow(conn, "onboard", {}, steps=["create", "welcome"], meta={"tenant": "acme"})
    bare = treadle.start_workflow(conn, "onboard", {}, steps=["create"])
    worker.start()
    assert until_run_finished(conn, run_id)["state"] == "completed"
    assert until_run_finished(conn, bare)["state"] == "completed"
    assert seen == {
        (run_id, "create"): {"tenant": "acme"},
        (run_id, "welcome"): {"tenant": "acme"},
        (bare, "create"): None,
    }
    steps = conn.execute(
        "SELECT step, meta FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id", [run_id]
    ).fetchall()
    assert steps == [("create", {"tenant": "acme"}), ("welcome", {"tenant": "acme"})]
    assert conn.execute("SELECT meta FROM treadle.jobs WHERE workflow_run_id = %s", [bare]).fetchone() == (None,)
