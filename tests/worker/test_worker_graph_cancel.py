"""A graph run cancelled by one of its own steps, in a real worker: the step's cancel stops the run's other steps.

A step whose cancel is requested while it runs (treadle.cancel) ends `cancelled` when its
handler returns, and cancels its run. The run's other steps stop as treadle.cancel_workflow
stops them: a running sibling's handler sees ctx.cancelled and its job ends cancelled, a
waiting sibling is cancelled before any claim takes it, and the join never starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from tests.worker.worker_support import run_steps, until_run_finished, until_state, wait_for
from treadle import JobContext, Step, Worker

MakeWorker = Callable[..., Worker]


def test_a_step_that_ends_cancelled_stops_its_siblings(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(queues=["gc"])
    started = {"stop": threading.Event(), "slow": threading.Event()}
    saw_cancel: dict[str, bool] = {}
    joined: list[str] = []

    def handler(step: str) -> Callable[[Any, JobContext], None]:
        def run(input: Any, ctx: JobContext) -> None:
            started[step].set()
            saw_cancel[step] = ctx.cancelled.wait(30)

        return run

    worker.workflow(
        "fanstop",
        [
            Step("stop", handler("stop"), after=[]),
            Step("slow", handler("slow"), after=[]),
            # in a queue no worker watches: it waits, available, while the others run
            Step("later", lambda i, c: joined.append("later"), after=[], queue="gc-later"),
            Step("join", lambda i, c: joined.append("join"), after=["stop", "slow", "later"]),
        ],
    )
    worker.start()
    row = conn.execute("SELECT treadle.start_workflow('fanstop', '{}', queue => 'gc')").fetchone()
    assert row is not None
    run_id = int(row[0])
    for event in started.values():
        assert event.wait(30)
    steps = {s["step"]: s for s in run_steps(conn, run_id)}
    assert (steps["stop"]["state"], steps["slow"]["state"], steps["later"]["state"]) == (
        "running",
        "running",
        "available",
    )

    assert conn.execute("SELECT treadle.cancel(%s)", [steps["stop"]["id"]]).fetchone() == (True,)
    assert until_state(conn, steps["stop"]["id"], "cancelled", "completed")["state"] == "cancelled"
    assert until_run_finished(conn, run_id)["state"] == "cancelled"
    assert until_state(conn, steps["later"]["id"], "cancelled", "running", "completed")["state"] == "cancelled"
    slow = until_state(conn, steps["slow"]["id"], "cancelled", "completed")
    assert slow["state"] == "cancelled" and slow["cancel_requested"]
    wait_for(lambda: "slow" in saw_cancel, "the running sibling's handler to return")
    assert saw_cancel == {"stop": True, "slow": True}
    # nothing of the run is left to claim, in any queue
    assert conn.execute(
        "SELECT count(*) FROM treadle.claim('w2', ARRAY['gc', 'gc-later'], batch => 10)"
    ).fetchone() == (0,)
    assert [s["step"] for s in run_steps(conn, run_id)] == ["stop", "slow", "later"]
    assert joined == []
