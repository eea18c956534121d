"""Three calls on a Citus cluster (make test-citus) that need a form Citus routes:
treadle.workflow_results (a read of a run by its id alone), enqueue's merges into a held
idempotency key (on_conflict 'replace', 'replace_args', 'append'), and a running run
with compensations that fails (its compensations start, on the coordinator)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.citus.conftest import CITUS_URL

Conn = psycopg.Connection[dict[str, Any]]


def claim(conn: Conn, queue: str) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM treadle.claim('w', ARRAY[%s])", [queue]).fetchall()


def one(conn: Conn, sql: str, params: list[Any]) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return next(iter(row.values()))


def job(conn: Conn, queue: str, job_id: int) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM treadle.jobs WHERE queue = %s AND id = %s", [queue, job_id]).fetchone()
    assert row is not None, f"no job {job_id} in {queue}"
    return row


def run_state(conn: Conn, queue: str, run_id: int) -> str:
    return str(one(conn, "SELECT state FROM treadle.workflow_runs WHERE queue = %s AND id = %s", [queue, run_id]))


# -- workflow_results ------------------------------------------------------------------------


def test_workflow_results_reads_a_run_by_its_id(conn: Conn, queue: str) -> None:
    run_id = one(
        conn,
        "SELECT treadle.start_workflow('citus5_results', '{}', steps => ARRAY['one', 'two'], queue => %s)",
        [queue],
    )
    assert one(conn, "SELECT treadle.workflow_results(%s)", [run_id]) == {}
    (step,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{\"one\": 1}')", [step["id"], step["lease_token"]])
    assert one(conn, "SELECT treadle.workflow_results(%s)", [run_id]) == {"one": {"one": 1}}
    assert one(conn, "SELECT treadle.workflow_results(-1)", []) is None


