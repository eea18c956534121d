"""Rolling deploys: two worker processes with two definitions of one workflow, runs in flight.

The old definition is [a, b]; the new one [a, b2, c] (b renamed, c added, a graph). Each
run keeps the definition it started with; each worker claims only the steps it has, so
no step is claimed by a worker that cannot run it: no LookupError, no attempt spent,
every run finishes with the steps of its own definition.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.worker.worker_support import run, run_steps, until_registered, until_run_finished, wait_for

pytestmark = pytest.mark.subprocess

RUNS = 4


def _start(conn: psycopg.Connection[Any], n: int) -> list[int]:
    return [
        int(row[0])
        for row in conn.execute(
            "SELECT treadle.start_workflow('deploy', jsonb_build_object('n', g)) FROM generate_series(1, %s) AS g", [n]
        ).fetchall()
    ]


def _two_steps(conn: psycopg.Connection[Any], run_id: int) -> list[dict[str, Any]]:
    return wait_for(lambda: len(steps := run_steps(conn, run_id)) == 2 and steps, f"run {run_id}'s step b")


def test_a_rolling_deploy_finishes_every_run_without_spending_an_attempt(
    effects_conn: psycopg.Connection[Any], spawn: Any
) -> None:
    conn = effects_conn
    # the old definition is live, and runs start with it
    conn.execute("SELECT treadle.define_workflow('deploy', ARRAY['a', 'b'])")
    old_runs = _start(conn, RUNS)

    # the new worker arrives first: it records the new definition and runs what it can
    new = spawn("new", deploy="new")
    until_registered(conn, "new")
    wait_for(
        lambda: conn.execute("SELECT version FROM treadle.workflows WHERE name = 'deploy'").fetchone() == (2,),
        "the new definition",
    )
    new_runs = _start(conn, RUNS)
    for run_id in new_runs:
        assert until_run_finished(conn, run_id)["state"] == "completed"
    # the old runs' first step was the new worker's to run (both definitions have it);
    # their b, which only the old definition has, waits unclaimed
    for run_id in old_runs:
        a, b = _two_steps(conn, run_id)
        assert (a["step"], a["state"], a["result"]["by"]) == ("a", "completed", "new")
        assert (b["name"], b["state"], b["attempt"], b["last_error"]) == ("workflow:deploy/b", "available", 0, None)
        assert run(conn, run_id)["state"] == "running"
        reasons = dict(conn.execute("SELECT reason, message FROM treadle.explain(%s)", [b["id"]]).fetchall())
        assert "no live worker runs step b of workflow deploy" in reasons["no_worker"], reasons

    # an old worker still running (or started again) finishes them
    old = spawn("old", deploy="old")
    for run_id in old_runs:
        assert until_run_finished(conn, run_id)["state"] == "completed"

    for run_id in old_runs:
        finished = run(conn, run_id)
        assert (finished["steps"], finished["version"]) == (["a", "b"], 1)
        assert sorted(finished["results"]) == ["a", "b"]
        assert finished["results"]["b"]["by"] == "old"
    for run_id in new_runs:
        finished = run(conn, run_id)
        assert (finished["steps"], finished["version"]) == (["a", "b2", "c"], 2)
        assert sorted(finished["results"]) == ["a", "b2", "c"]
        assert {finished["results"][s]["by"] for s in ("a", "b2", "c")} == {"new"}
    # every step ran once, with its first attempt
    attempts = conn.execute(
        "SELECT attempt, count(*) FROM treadle.jobs WHERE workflow_run_id = ANY (%s) GROUP BY attempt",
        [old_runs + new_runs],
    ).fetchall()
    assert attempts == [(1, RUNS * 2 + RUNS * 3)]
    ran = conn.execute("SELECT job_id, count(*) FROM effects WHERE what = 'ran' GROUP BY job_id").fetchall()
    assert len(ran) == RUNS * 2 + RUNS * 3 and {count for _, count in ran} == {1}
    for child in (new, old):
        assert "LookupError" not in child.log() and "no step" not in child.log(), child.log()
