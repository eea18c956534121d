"""A handler reads the metadata its producer stored with the job (ctx.meta, ctx.job.meta)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

import treadle
from tests.worker.worker_support import until_state
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
