"""Wait steps in a worker: a run waits for a signal without holding a worker, the signal's
payload reaches the steps after it, a signal sent early is kept, a wait that times out fails
the run (the worker's rescue times it out)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.worker.worker_support import run, run_steps, start_workflow, until_run_finished, wait_for
from treadle import InvalidArgument, JobContext, Wait, Worker, client

MakeWorker = Callable[..., Worker]


def ship(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"shipped": input["order"], "approved_by": ctx.results["approve"]["by"]}


def test_a_run_waits_for_its_signal_and_hands_on_the_payload(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker()
    worker.workflow(
        "approval",
        [
            ("order", lambda i, c: {"total": 10}),
            Wait("approve", "approved", timeout=timedelta(days=1)),
            ("ship", ship),
        ],
    )
    worker.start()
    assert conn.execute("SELECT steps, waits FROM treadle.workflows WHERE name = 'approval'").fetchone() == (
        ["order", "approve", "ship"],
        {"approve": {"signal": "approved", "timeout": "1 day"}},
    )
    waiting = start_workflow(conn, "approval", {"order": 1})
    early = start_workflow(conn, "approval", {"order": 2})
    # a signal before the run reaches its wait is kept for it
    assert client.signal(conn, early, "approved", {"by": "bob"}) in ("kept", "delivered")
    wait_for(lambda: run(conn, waiting)["waiting"], "the run to wait for its signal")
    assert run(conn, waiting)["state"] == "running"
    assert [s["step"] for s in run_steps(conn, waiting)] == ["order"]  # the wait is no job
    assert client.signal(conn, waiting, "approved", {"by": "ann"}) == "delivered"

    finished = until_run_finished(conn, waiting)
    assert finished["state"] == "completed"
    assert finished["results"]["approve"] == {"by": "ann"}
    assert finished["results"]["ship"] == {"shipped": 1, "approved_by": "ann"}
    assert until_run_finished(conn, early)["results"]["ship"] == {"shipped": 2, "approved_by": "bob"}
    assert client.signal(conn, waiting, "approved") == "finished"


def test_a_run_is_signalled_by_its_idempotency_key(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.workflow("keyed", [Wait("approve", "approved"), ("ship", ship)])
    worker.start()
    run_id = client.start_workflow(conn, "keyed", {"order": 7}, idempotency_key="order-7")
    assert client.signal_by_key(conn, "default", "order-7", "approved", {"by": "key"}) == "delivered"
    assert until_run_finished(conn, run_id)["results"]["ship"] == {"shipped": 7, "approved_by": "key"}
    assert client.signal_by_key(conn, "default", "order-8", "approved") == "unknown"


def test_a_wait_that_times_out_fails_the_run(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.workflow("late", [Wait("approve", "approved", timeout=timedelta(seconds=1)), ("ship", ship)])
    worker.start()
    run_id = start_workflow(conn, "late", {"order": 3})
    finished = until_run_finished(conn, run_id)  # the worker's rescue times the wait out
    assert finished["state"] == "failed"
    assert finished["waiting"]["approve"]["timed_out"] is True
    assert finished["finished_at"] - finished["created_at"] >= timedelta(seconds=1)
    assert run_steps(conn, run_id) == []
    assert client.signal(conn, run_id, "approved") == "finished"


def test_a_wait_that_continues_on_timeout_takes_the_timeout_path(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    def ship_or_not(input: dict[str, Any], ctx: JobContext) -> str:
        return "cancelled order" if ctx.results["approve"].get("timed_out") else "shipped"

    worker = make_worker()
    worker.workflow(
        "patient",
        [Wait("approve", "approved", timeout=timedelta(seconds=1), on_timeout="continue"), ("ship", ship_or_not)],
    )
    worker.start()
    assert conn.execute("SELECT waits FROM treadle.workflows WHERE name = 'patient'").fetchone() == (
        {"approve": {"signal": "approved", "timeout": "00:00:01", "on_timeout": "continue"}},
    )
    run_id = start_workflow(conn, "patient", {})
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"] == {"approve": {"timed_out": True}, "ship": "cancelled order"}


def test_a_run_started_from_the_client_with_waits(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.workflow("adhoc", [Wait("approve", "approved"), ("ship", ship)])
    worker.start()
    run_id = client.start_workflow(
        conn,
        "adhoc",
        {"order": 9},
        steps=["approve", "ship"],
        waits={"approve": {"signal": "approved", "timeout": timedelta(hours=1)}},
    )
    assert run(conn, run_id)["waits"] == {"approve": {"signal": "approved", "timeout": "01:00:00"}}
    assert client.signal(conn, run_id, "approved", {"by": "cli"}) == "delivered"
    assert until_run_finished(conn, run_id)["state"] == "completed"


def test_a_bad_wait_is_refused_when_it_is_registered(make_worker: MakeWorker) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument, match="signal of wait step 'w'"):
        worker.workflow("bad", [Wait("w", "")])
    with pytest.raises(InvalidArgument, match=r"needs a datetime\.timedelta timeout, not int"):
        worker.workflow("bad", [Wait("w", "go", timeout=5)])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must time out after more than 0 and at most 366 days"):
        worker.workflow("bad", [Wait("w", "go", timeout=timedelta(days=400))])
    with pytest.raises(InvalidArgument, match="repeats the step name 'a'"):
        worker.workflow("bad", [("a", lambda i, c: 1), Wait("a", "go")])
    with pytest.raises(InvalidArgument, match="on_timeout is 'fail' or 'continue', not 'skip'"):
        worker.workflow("bad", [Wait("w", "go", timeout=timedelta(hours=1), on_timeout="skip")])
    with pytest.raises(InvalidArgument, match="on_timeout='continue' needs a timeout"):
        worker.workflow("bad", [Wait("w", "go", on_timeout="continue")])
    with pytest.raises(InvalidArgument, match="waits"):
        client.start_workflow(None, "x", waits={"a": {"signal": "go", "branch": "b"}})  # type: ignore[call-overload]
