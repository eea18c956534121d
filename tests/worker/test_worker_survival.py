"""The worker survives any job: each bad job fails alone, clearly, and the worker goes on.

Real worker processes (child_worker.py). The payloads nested too deeply for
Python's JSON decoder are written straight into the tables, as rows written by
treadle 0.1.0 (which had no depth bound) can hold them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from tests.worker.worker_support import Child, enqueue, job, start_workflow, until_run_finished, until_state, wait_for

STEPS = ["reserve", "charge", "notify"]
DEEP = "[" * 1500 + "]" * 1500  # 1,500 levels: more than Python's decoder takes


def enqueue_all(conn: psycopg.Connection[Any], jobs: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Enqueue in one transaction, so that one claim can take them all."""
    with conn.transaction():
        return [enqueue(conn, name, args, max_attempts=1) for name, args in jobs]


def outcome(conn: psycopg.Connection[Any], job_id: int) -> tuple[str, int, str | None]:
    row = conn.execute("SELECT state, attempt, last_error FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    found: tuple[str, int, str | None] = row
    return found


def run_state(conn: psycopg.Connection[Any], run_id: int) -> str:
    # not the whole row: this test's own client could not decode the deep columns either
    row = conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return str(row[0])


def deepen(conn: psycopg.Connection[Any], sql: str, row_id: int) -> None:
    conn.execute(sql, {"deep": DEEP, "id": row_id})


def test_bad_jobs_fail_alone_and_the_batch_completes(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    misdeeds = ["keyboard_interrupt", "system_exit", "generator_exit", "set", "nan", "deep_list", "object", "generator"]
    with conn.transaction():
        healthy = [enqueue(conn, "record", {}, max_attempts=1) for _ in range(3)]
        undecodable = enqueue(conn, "record", {}, max_attempts=1)
        deepen(conn, "UPDATE treadle.jobs SET args = %(deep)s::jsonb WHERE id = %(id)s", undecodable)
        bad = {do: enqueue(conn, "misbehave", {"do": do}, max_attempts=1) for do in misdeeds}
    child = spawn("survivor", concurrency=16)

    for job_id in healthy:
        assert until_state(conn, job_id, "completed", "discarded")["state"] == "completed"
    expected = {
        "keyboard_interrupt": "KeyboardInterrupt",
        "system_exit": "SystemExit: 3",
        "generator_exit": "GeneratorExit",
        "set": "is a set, which JSON cannot hold",
        "nan": "JSON has no NaN",
        "deep_list": "nested too deeply to encode as JSON",
        "object": "is a object, which JSON cannot hold",
        "generator": "is a generator, which JSON cannot hold",
    }
    for do, job_id in bad.items():
        row = until_state(conn, job_id, "completed", "discarded")
        assert row["state"] == "discarded", do
        assert expected[do] in row["last_error"], (do, row["last_error"][-300:])
    state, attempt, error = wait_for(
        lambda: (row := outcome(conn, undecodable))[0] != "running" and row, "the undecodable job to finish"
    )
    assert (state, attempt) == ("discarded", 1)
    assert error is not None
    assert f"job {undecodable}'s args is nested too deeply for Python's JSON decoder" in error

    # the same process, its threads still serving, runs the next job
    after = enqueue(conn, "record", {})
    assert until_state(conn, after, "completed", "discarded")["state"] == "completed"
    assert child.process.poll() is None, child.log()
    assert conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'running'").fetchone() == (0,)


def test_a_long_traceback_keeps_its_head_and_its_last_line(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    job_id = enqueue(effects_conn, "misbehave", {"do": "long_error"}, max_attempts=1)
    spawn("trimmer")
    error = until_state(effects_conn, job_id, "discarded")["last_error"]
    assert len(error) <= 16_384
    assert error.startswith("Traceback (most recent call last):")
    assert error.endswith(" tail") and "ValueError: head xxx" in error
    assert "characters of the traceback cut" in error


def test_a_step_whose_run_cannot_be_decoded_fails_clearly(
    effects_conn: psycopg.Connection[Any], spawn: Callable[..., Child]
) -> None:
    conn = effects_conn
    with conn.transaction():
        deep_input = start_workflow(conn, "trip", {"id": 1}, STEPS)
        deepen(
            conn,
            "UPDATE treadle.workflow_runs SET input = %(deep)s::jsonb, max_attempts = 1 WHERE id = %(id)s",
            deep_input,
        )
        conn.execute("UPDATE treadle.jobs SET max_attempts = 1 WHERE workflow_run_id = %s", [deep_input])
        deep_results = start_workflow(conn, "trip", {"id": 2}, STEPS)
        conn.execute("UPDATE treadle.jobs SET max_attempts = 1 WHERE workflow_run_id = %s", [deep_results])
        # as if its first step had completed with that result: the second step receives it
        conn.execute(
            "UPDATE treadle.workflow_runs SET results = jsonb_build_object(%(first)s::text, %(deep)s::jsonb) "
            "WHERE id = %(id)s",
            {"first": STEPS[0], "deep": DEEP, "id": deep_results},
        )
        conn.execute("UPDATE treadle.jobs SET step = %s WHERE workflow_run_id = %s", [STEPS[1], deep_results])
        fine = start_workflow(conn, "trip", {"id": 3}, STEPS)
    spawn("stepper", concurrency=8)

    assert until_run_finished(conn, fine)["state"] == "completed"
    for run_id, what in ((deep_input, "input"), (deep_results, "results")):
        # called at once, inside the loop: the lambda never outlives this run_id
        wait_for(lambda: run_state(conn, run_id) != "running", f"run {run_id} to finish")  # noqa: B023
        assert run_state(conn, run_id) == "failed"
        step_job = conn.execute("SELECT id FROM treadle.jobs WHERE workflow_run_id = %s", [run_id]).fetchone()
        assert step_job is not None
        error = job(conn, step_job[0])["last_error"]
        assert f"workflow run {run_id}'s {what} is nested too deeply" in error, error[-300:]
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'running'").fetchone() == (0,),
        "no job left running",
    )
