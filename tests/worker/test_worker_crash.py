"""Crash tests: a real worker process is SIGKILLed at a chosen point, a second one recovers.

The victim runs tests/worker/child_worker.py and kills itself at the point under
test; the rescuer is another such process. The table `effects` records every
handler run, so a step that ran twice shows up as two rows. What recovery must
give: no job lost, no completed workflow step run again, and each job the victim
held picked up again soon after its lease expired (reliability.md 3.1 F1, 3.8 W1).
"""

from __future__ import annotations

import signal
from datetime import datetime
from typing import Any

import psycopg

from tests.worker.worker_support import (
    LEASE,
    POLL,
    RESCUE,
    effects,
    enqueue,
    job,
    run,
    run_steps,
    start_workflow,
    until_registered,
    until_run_finished,
    until_state,
    wait_for,
)

TRIP = ["reserve", "charge", "notify"]

# The recovery bound of reliability.md 3.0 is B = L + R + P + ε from the kill. The last
# test measures exactly that, with the rescuer already running. The others start the
# rescuer after the death, so they measure from the later of the lease's expiry and the
# rescuer's start (a fresh Python process may take seconds to start on a loaded machine,
# which says nothing about recovery): the pickup must come within R + P + ε of that.
# ε is generous because other test suites share these two cores.
SLACK = 2.0


def held_by(conn: psycopg.Connection[Any], job_ids: list[int], worker_id: str) -> list[dict[str, Any]]:
    """The jobs a dead worker still holds: running on its lease."""
    rows = [job(conn, job_id) for job_id in job_ids]
    return [row for row in rows if row["state"] == "running" and row["worker_id"] == worker_id]


def assert_picked_up_promptly(conn: psycopg.Connection[Any], dead: dict[str, Any], rescuer_started: datetime) -> None:
    """`dead` is the job's row while the dead worker held it; the job is finished now."""
    now = job(conn, dead["id"])
    assert now["attempt"] == dead["attempt"] + 1, "one more claim, by the rescuer"
    assert now["started_at"] >= dead["lease_until"], "never claimed while the dead worker's lease held"
    assert "lease expired: worker victim stopped heartbeating" in now["errors"][-1]["error"]
    since = max(dead["lease_until"], rescuer_started)
    pickup = (now["started_at"] - since).total_seconds()
    bound = RESCUE + POLL + SLACK
    print(f"job {dead['id']}: picked up {pickup:.3f} s after its lease expired ({LEASE} s lease), bound {bound} s")
    assert pickup <= bound


def start_rescuer(conn: psycopg.Connection[Any], spawn: Any) -> datetime:
    """Start the second worker; returns when it started (database time)."""
    spawn("rescuer")
    started: datetime = until_registered(conn, "rescuer")["started_at"]
    return started


def test_killed_after_claim_before_the_handler(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    ids = [enqueue(conn, "record") for _ in range(3)]
    victim = spawn("victim", "after_claim", concurrency=2)
    assert victim.wait_exit() == -signal.SIGKILL, victim.log()
    dead = held_by(conn, ids, "victim")
    assert len(dead) == 2, "the victim claimed a batch of two and died before running either"
    assert effects(conn, "ran") == []

    rescuer_started = start_rescuer(conn, spawn)
    for job_id in ids:
        row = until_state(conn, job_id, "completed")
        assert row["result"]["by"] == "rescuer"
        assert [e["worker"] for e in effects(conn, "ran", job_id=job_id)] == ["rescuer"]
    for row in dead:
        assert_picked_up_promptly(conn, row, rescuer_started)


def test_killed_inside_the_handler(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    job_id = enqueue(conn, "record")
    victim = spawn("victim", "in_handler", concurrency=1)
    assert victim.wait_exit() == -signal.SIGKILL, victim.log()
    (dead,) = held_by(conn, [job_id], "victim")

    rescuer_started = start_rescuer(conn, spawn)
    row = until_state(conn, job_id, "completed")
    assert row["result"] == {"by": "rescuer", "attempt": 2}
    # at least once: the handler ran again, since the first run never finished
    assert [(e["worker"], e["attempt"]) for e in effects(conn, "ran", job_id=job_id)] == [("victim", 1), ("rescuer", 2)]
    assert_picked_up_promptly(conn, dead, rescuer_started)


def test_killed_during_completion(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    job_id = enqueue(conn, "record")
    victim = spawn("victim", "during_completion", concurrency=1)
    assert victim.wait_exit() == -signal.SIGKILL, victim.log()
    (dead,) = held_by(conn, [job_id], "victim")
    assert dead["result"] is None, "the completion was never written"

    rescuer_started = start_rescuer(conn, spawn)
    row = until_state(conn, job_id, "completed")
    assert row["result"]["by"] == "rescuer"
    assert [e["worker"] for e in effects(conn, "ran", job_id=job_id)] == ["victim", "rescuer"]
    assert_picked_up_promptly(conn, dead, rescuer_started)


def test_killed_inside_a_step_after_its_side_effect(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    run_id = start_workflow(conn, "trip", {"order": 7}, TRIP)
    victim = spawn("victim", "step_after_effect:charge", concurrency=1)
    assert victim.wait_exit() == -signal.SIGKILL, victim.log()
    steps = run_steps(conn, run_id)
    assert [(s["step"], s["state"]) for s in steps] == [("reserve", "completed"), ("charge", "running")]

    rescuer_started = start_rescuer(conn, spawn)
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"]["reserve"]["by"] == "victim"
    assert finished["results"]["charge"]["by"] == "rescuer"
    assert finished["results"]["notify"]["seen"] == ["charge", "reserve"]
    assert finished["results"]["notify"]["input"] == {"order": 7}
    ran = [(e["step"], e["worker"]) for e in effects(conn, "ran")]
    # the completed step never ran again; the step that died ran once more
    assert ran == [("reserve", "victim"), ("charge", "victim"), ("charge", "rescuer"), ("notify", "rescuer")]
    assert_picked_up_promptly(conn, steps[1], rescuer_started)


def test_killed_after_a_step_result_is_stored(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    run_id = start_workflow(conn, "trip", {"order": 8}, TRIP)
    victim = spawn("victim", "after_step_stored:reserve", concurrency=1)
    assert victim.wait_exit() == -signal.SIGKILL, victim.log()
    assert run(conn, run_id)["results"]["reserve"]["by"] == "victim"
    # the next step was enqueued in the completing transaction; the victim may have
    # claimed it in the instant before it died
    dead = held_by(conn, [s["id"] for s in run_steps(conn, run_id)], "victim")

    rescuer_started = start_rescuer(conn, spawn)
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"]["notify"]["seen"] == ["charge", "reserve"]
    assert [e["worker"] for e in effects(conn, "ran", step="reserve")] == ["victim"]
    assert len(effects(conn, "ran", step="charge")) <= 2  # at most one extra run, for the one crash
    assert [e["worker"] for e in effects(conn, "ran", step="notify")] == ["rescuer"]
    for row in dead:
        assert_picked_up_promptly(conn, row, rescuer_started)


def test_killed_inside_one_branch_of_a_graph(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    """Both branches run at once in the victim, which dies inside `right`: the rescuer runs
    what did not complete, a completed branch never runs again, and the join runs once."""
    conn = effects_conn
    row = conn.execute(
        "SELECT treadle.start_workflow('fork', '{\"order\": 9}', steps => ARRAY['left', 'right', 'join'],"
        ' after => \'{"join": ["left", "right"]}\')'
    ).fetchone()
    assert row is not None
    run_id = row[0]
    victim = spawn("victim", "step_after_effect:right", concurrency=2)
    assert victim.wait_exit() == -signal.SIGKILL, victim.log()

    start_rescuer(conn, spawn)
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"]["right"]["by"] == "rescuer"
    assert finished["results"]["join"]["seen"] == ["left", "right"]
    assert [e["worker"] for e in effects(conn, "ran", step="join")] == ["rescuer"]
    left = [e["worker"] for e in effects(conn, "ran", step="left")]
    if finished["results"]["left"]["by"] == "victim":
        assert left == ["victim"]  # completed before the kill: never again
    else:
        assert left in (["rescuer"], ["victim", "rescuer"])
    assert [e["worker"] for e in effects(conn, "ran", step="right")] == ["victim", "rescuer"]
    assert sorted(s["step"] for s in run_steps(conn, run_id)) == ["join", "left", "right"]


def test_a_running_worker_picks_up_a_killed_workers_job_within_the_bound(
    effects_conn: psycopg.Connection[Any], spawn: Any
) -> None:
    """Recovery measured from the kill itself (reliability.md 3.0: B = L + R + P + ε)."""
    conn = effects_conn
    job_id = enqueue(conn, "record", {"seconds": {"victim": 3600}})  # long only in the victim
    victim = spawn("victim", concurrency=1)
    wait_for(lambda: effects(conn, "ran", job_id=job_id), "the victim's handler to start")
    spawn("rescuer")
    until_registered(conn, "rescuer")
    clock = conn.execute("SELECT clock_timestamp()").fetchone()
    assert clock is not None
    killed_at = clock[0]
    victim.process.kill()
    assert victim.wait_exit() == -signal.SIGKILL

    row = until_state(conn, job_id, "completed")
    assert row["result"] == {"by": "rescuer", "attempt": 2}
    recovery = (row["started_at"] - killed_at).total_seconds()
    bound = LEASE + RESCUE + POLL + SLACK
    print(f"job {job_id}: picked up {recovery:.3f} s after the kill ({LEASE} s lease), bound {bound} s")
    assert recovery <= bound
