"""A worker is SIGKILLed while it runs the head of an ordered lane: once its lease is
rescued, the lane goes on in enqueue order with a second worker, one job at a time;
no job is lost and none but the killed one runs twice (at least once: the killed
attempt never finished)."""

from __future__ import annotations

import signal
from itertools import pairwise
from typing import Any

import psycopg

from tests.worker.worker_support import effects, enqueue, until_state


def test_a_lane_whose_running_head_was_killed_goes_on_in_order(
    effects_conn: psycopg.Connection[Any], spawn: Any
) -> None:
    conn = effects_conn
    conn.execute("SELECT treadle.set_queue('default', key_ordered => true)")
    lane = [enqueue(conn, "record", {"n": n}, concurrency_key="customer:7") for n in range(4)]
    other = enqueue(conn, "record", {"n": "other"}, concurrency_key="customer:8")
    assert [r[0] for r in conn.execute("SELECT state FROM treadle.jobs WHERE id = ANY(%s) ORDER BY id", [lane])] == [
        "available", "blocked", "blocked", "blocked"
    ]  # fmt: skip
    victim = spawn("victim", "in_handler", concurrency=1)
    assert victim.wait_exit() == -signal.SIGKILL, victim.log()
    killed = [e["job_id"] for e in effects(conn, "ran")]
    assert len(killed) == 1 and killed[0] in (lane[0], other), "the victim died inside its first job"

    spawn("rescuer")
    for job_id in [*lane, other]:
        assert until_state(conn, job_id, "completed")["state"] == "completed"
    ran = effects(conn, "ran")
    runs = {job_id: [(e["worker"], e["attempt"]) for e in ran if e["job_id"] == job_id] for job_id in [*lane, other]}
    assert runs[killed[0]] == [("victim", 1), ("rescuer", 2)], "the killed attempt runs again, once"
    for job_id in [*lane, other]:
        if job_id != killed[0]:
            assert runs[job_id] == [("rescuer", 1)], "every other job ran once"
    lane_runs = [e["job_id"] for e in ran if e["job_id"] in lane]
    assert lane_runs == sorted(lane_runs), "the lane ran in enqueue order"
    # a handler starts (effects.at, the clock) after the finish before it committed (finished_at: its start)
    finished = dict(conn.execute("SELECT id, finished_at FROM treadle.jobs WHERE id = ANY(%s)", [lane]).fetchall())
    last_start = {e["job_id"]: e["at"] for e in ran if e["job_id"] in lane}
    for before, after in pairwise(lane):
        assert last_start[after] >= finished[before], "one job of the lane at a time"
    assert conn.execute("SELECT count(*) FROM treadle.key_slots").fetchone() == (0,)
