"""Stored JSON this client cannot decode (nested deeper than Python's decoder goes, as rows
written by treadle 0.1.0 may hold): the reads that meet it raise UndecodablePayload, never
RecursionError, and leave the connection usable."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import treadle
from tests.client.producer_support import SqlWorker

DEEP = "[" * 1500 + "]" * 1500
STEPS = ["only"]


def deepen(conn: psycopg.Connection[Any], sql: str, row_id: int) -> None:
    # as the superuser, past the SQL's own bounds: the shape an old row can have
    conn.execute(sql, {"deep": DEEP, "id": row_id})


def test_wait_and_get_job_on_a_result_too_deep_to_decode(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    job_id = treadle.enqueue(conn, "x")
    sql_worker.complete(job_id, {"fine": True})
    deepen(conn, "UPDATE treadle.jobs SET result = %(deep)s::jsonb WHERE id = %(id)s", job_id)
    for target in (dsn, conn):
        with pytest.raises(treadle.UndecodablePayload, match=f"job {job_id}'s result is nested too deeply"):
            treadle.wait(target, job_id, timeout=5)
    with pytest.raises(treadle.UndecodablePayload, match=f"job {job_id}'s result is nested too deeply"):
        treadle.get_job(conn, job_id)
    assert treadle.cancel(conn, job_id) is False  # the connection goes on

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with pytest.raises(treadle.UndecodablePayload):
                await treadle.wait(aconn, job_id, timeout=5)

    asyncio.run(scenario())


def test_wait_workflow_on_results_too_deep_to_decode(
    dsn: str, conn: psycopg.Connection[Any], sql_worker: SqlWorker
) -> None:
    run_id = treadle.start_workflow(conn, "w", {}, steps=STEPS)
    row = conn.execute("SELECT id FROM treadle.jobs WHERE workflow_run_id = %s", [run_id]).fetchone()
    assert row is not None
    sql_worker.complete(row[0], {"fine": True})
    deepen(
        conn,
        "UPDATE treadle.workflow_runs SET results = jsonb_build_object('only', %(deep)s::jsonb) WHERE id = %(id)s",
        run_id,
    )
    with pytest.raises(treadle.UndecodablePayload, match=f"workflow run {run_id}'s results is nested too deeply"):
        treadle.wait_workflow(dsn, run_id, timeout=5)
    with pytest.raises(treadle.UndecodablePayload):
        treadle.wait_workflow(conn, run_id, timeout=5)
