"""Answers lost after the server committed: the worker finds out what committed and acts on it.

A real worker process talks to the server through lossy_proxy.LossyProxy, which
lets a chosen statement run and commit, then drops its answer and the client's
connection. Finishing is idempotent per lease token, so a repeated complete_many
or fail answers what the first one did; a claim is read back by its own token
(treadle.claimed) and its jobs run, without spending another attempt. The worker
finishes successes with treadle.complete_and_claim, which claims in the same
statement: after its answer is lost, both halves are recovered that way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.markers import marks_users
from tests.worker.lossy_proxy import LossyProxy, lossy_proxy
from tests.worker.worker_support import Child, effects, enqueue, until_state, wait_for

EVENTS = "claimed,completed,failed,cancelled,lease_lost,released"


@pytest.fixture
def proxy(pg_server: str) -> Iterator[LossyProxy]:
    with lossy_proxy(pg_server) as proxy:
        yield proxy


@pytest.fixture
@marks_users(pytest.mark.subprocess)
def spawn_behind(proxy: LossyProxy, dsn: str, tmp_path: Path) -> Iterator[Callable[[str], Child]]:
    """Start a child worker whose every connection goes through the proxy."""
    children: list[Child] = []

    def start(worker_id: str) -> Child:
        child = Child(
            proxy.dsn(str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])),
            worker_id,
            "none",
            tmp_path,
            events=EVENTS,
            concurrency=4,
            lease=5.0,  # (a one-second lease ran out under load before the first heartbeat)
        )
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()


def kinds_of(conn: psycopg.Connection[Any], job_id: int) -> list[str]:
    return [row["what"] for row in effects(conn, job_id=job_id)]


def test_a_completion_whose_answer_was_lost_is_reported_completed(
    effects_conn: psycopg.Connection[Any], proxy: LossyProxy, spawn_behind: Callable[[str], Child]
) -> None:
    conn = effects_conn
    proxy.lose("treadle.complete_and_claim(")
    with conn.transaction():
        jobs = [enqueue(conn, "record", {}, max_attempts=1) for _ in range(3)]
    child = spawn_behind("unlucky-completer")
    for job_id in jobs:
        assert until_state(conn, job_id, "completed", "discarded")["state"] == "completed"
        # called at once, inside the loop: the lambda never outlives this job_id
        wait_for(lambda: "completed" in kinds_of(conn, job_id), f"job {job_id}'s completed event")  # noqa: B023
    assert proxy.lost == 1, child.log()
    for job_id in jobs:
        assert kinds_of(conn, job_id) == ["claimed", "ran", "completed"], child.log()


def test_a_fail_whose_answer_was_lost_is_reported_failed(
    effects_conn: psycopg.Connection[Any], proxy: LossyProxy, spawn_behind: Callable[[str], Child]
) -> None:
    conn = effects_conn
    proxy.lose("treadle.fail(")
    job_id = enqueue(conn, "misbehave", {"do": "set"}, max_attempts=1)
    child = spawn_behind("unlucky-failer")
    row = until_state(conn, job_id, "discarded")
    assert "is a set, which JSON cannot hold" in row["last_error"]
    assert len(row["errors"]) == 1  # the repeated fail wrote nothing more
    wait_for(lambda: "failed" in kinds_of(conn, job_id), "the failed event")
    assert proxy.lost == 1, child.log()
    assert kinds_of(conn, job_id) == ["claimed", "ran", "failed"], child.log()


def test_a_claim_whose_answer_was_lost_is_adopted_without_spending_an_attempt(
    effects_conn: psycopg.Connection[Any], proxy: LossyProxy, spawn_behind: Callable[[str], Child]
) -> None:
    conn = effects_conn
    proxy.lose("treadle.claim(")
    # one attempt only: a rescue of the orphaned claim would discard the job unrun
    job_id = enqueue(conn, "record", {}, max_attempts=1)
    child = spawn_behind("unlucky-claimer")
    row = until_state(conn, job_id, "completed", "discarded")
    assert proxy.lost == 1, child.log()
    assert (row["state"], row["attempt"], row["errors"]) == ("completed", 1, []), child.log()
    assert row["result"] == {"by": "unlucky-claimer", "attempt": 1}
    wait_for(lambda: "completed" in kinds_of(conn, job_id), "the completed event")
    assert kinds_of(conn, job_id) == ["claimed", "ran", "completed"]
    assert "the lost claim had committed; running its 1 jobs" in child.log()


def test_a_finish_and_claim_whose_answer_was_lost_finishes_once_and_runs_what_it_claimed(
    effects_conn: psycopg.Connection[Any], proxy: LossyProxy, spawn_behind: Callable[[str], Child]
) -> None:
    conn = effects_conn
    # the first claim fills all 4 slots, so more is waiting: the first write of successes
    # claims too, and that is the answer lost
    proxy.lose("treadle.complete_and_claim(")
    with conn.transaction():
        jobs = [enqueue(conn, "record", {}, max_attempts=1) for _ in range(12)]
    child = spawn_behind("unlucky-cycler")
    rows = [until_state(conn, job_id, "completed", "discarded") for job_id in jobs]
    assert proxy.lost == 1, child.log()
    # one attempt each: nothing was left to a rescue, nothing ran twice
    assert [(row["state"], row["attempt"], row["errors"]) for row in rows] == [("completed", 1, [])] * 12, child.log()
    for job_id in jobs:
        wait_for(lambda: "completed" in kinds_of(conn, job_id), f"job {job_id}'s completed event")  # noqa: B023
        assert kinds_of(conn, job_id) == ["claimed", "ran", "completed"], child.log()
    assert "the lost claim had committed; running its" in child.log()
