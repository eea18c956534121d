"""Handlers that misbehave in ways a job must still end from, in real worker processes (child_worker.py).

- an async handler that raises GeneratorExit itself fails its job (it is not the loop
  closing the task), so the job does not stay running with its lease renewed;
- an exception whose __str__ raises is still written, with a fallback message;
- a result JSON can never hold (a set, non-string keys) discards the job at once,
  its other attempts unspent: running the handler again could only repeat its effects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.worker.worker_support import Child, effects, enqueue, wait_for

pytestmark = pytest.mark.subprocess


def finished(conn: psycopg.Connection[Any], job_id: int, timeout: float = 20.0) -> dict[str, Any]:
    """The job's row once it has left running (a job left running past `timeout` fails the test)."""

    def row() -> dict[str, Any] | None:
        found = conn.execute(
            "SELECT state, attempt, max_attempts, last_error FROM treadle.jobs WHERE id = %s", [job_id]
        ).fetchone()
        assert found is not None
        state, attempt, max_attempts, last_error = found
        if state in ("available", "running"):
            return None
        return {"state": state, "attempt": attempt, "max_attempts": max_attempts, "last_error": last_error}

    return wait_for(row, f"job {job_id} to finish", timeout)


def test_an_async_handler_raising_generator_exit_fails_its_job(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    job_id = enqueue(conn, "amisbehave", {"do": "generator_exit"}, max_attempts=1)
    spawn("closer")
    row = finished(conn, job_id)
    assert row["state"] == "discarded"
    assert "GeneratorExit" in row["last_error"]
    # the worker goes on: the next job runs
    after = enqueue(conn, "record", {}, max_attempts=1)
    assert finished(conn, after)["state"] == "completed"


def test_an_exception_whose_str_raises_is_written(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    jobs = [enqueue(conn, name, {"do": "unprintable"}, max_attempts=1) for name in ("misbehave", "amisbehave")]
    child = spawn("unprintable")
    for job_id in jobs:
        row = finished(conn, job_id)
        assert row["state"] == "discarded", row
        assert "UnprintableError" in row["last_error"]
    # the warning is logged just after the job's row is written
    wait_for(lambda: "its message could not be read" in child.log(), "the worker to log the unreadable message")


def test_a_result_json_cannot_hold_discards_the_job_at_once(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    jobs = {
        (name, do): enqueue(conn, name, {"do": do}, max_attempts=5)
        for name in ("misbehave", "amisbehave")
        for do in ("set", "int_keys")
    }
    spawn("unstorable")
    for (name, do), job_id in jobs.items():
        row = finished(conn, job_id)
        assert (row["state"], row["attempt"]) == ("discarded", 1), (name, do, row)
        assert "cannot be stored as JSON" in row["last_error"], (name, do, row["last_error"][-400:])
        reason = "is a set, which JSON cannot hold" if do == "set" else "JSON object keys must be strings"
        assert reason in row["last_error"], (name, do)
        assert len(effects(conn, "ran", job_id=job_id)) == 1, (name, do)  # the handler ran once
