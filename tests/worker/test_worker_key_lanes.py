"""A worker is SIGKILLed while it runs the head of an ordered lane: once its lease is
rescued, the lane goes on in enqueue order with a second worker, one job at a time;
no job is lost and none but the killed one runs twice (at least once: the killed
attempt never finished). A job scheduled for later never holds its key's slot while
due jobs of the key wait."""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta
from itertools import pairwise
from typing import Any

import psycopg

import treadle
from tests.worker.worker_support import effects, enqueue, job, until_state
from treadle import JobContext, Worker


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


def test_due_jobs_of_a_key_run_while_its_job_scheduled_for_later_waits(
    conn: psycopg.Connection[Any], make_worker: Callable[..., Worker]
) -> None:
    worker = make_worker()
    ran: list[int] = []

    @worker.register
    def sync(args: Any, ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    later = treadle.enqueue(conn, "sync", run_at=timedelta(hours=1), concurrency_key="account:1")
    due = [treadle.enqueue(conn, "sync", {"n": n}, concurrency_key="account:1") for n in range(3)]
    assert [job(conn, j)["state"] for j in [later, *due]] == ["blocked", "available", "blocked", "blocked"]
    worker.start()
    for job_id in due:
        assert until_state(conn, job_id, "completed")["state"] == "completed"
    assert ran == due, "the due jobs ran, oldest first; the one scheduled for later did not"
    waiting = job(conn, later)
    assert (waiting["state"], waiting["key_slot"]) == ("available", True), "then it holds the slot until its time"
    assert conn.execute("SELECT held FROM treadle.key_slots WHERE key = 'account:1'").fetchone() == (1,)
