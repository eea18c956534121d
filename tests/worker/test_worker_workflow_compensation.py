"""Compensation in a worker: a run that fails for good undoes its completed steps in
reverse order of completion, and wait_workflow reports the failure once they are done."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import treadle
from tests.worker.worker_support import run, start_workflow
from treadle import Compensation, Discard, InvalidArgument, JobContext, Worker

MakeWorker = Callable[..., Worker]


def test_a_failed_transfer_undoes_its_completed_steps_in_reverse(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker
) -> None:
    worker = make_worker()
    undone: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def undo(what: str) -> Callable[[Any, JobContext], str]:
        def compensate(input: Any, ctx: JobContext) -> str:
            with lock:
                undone.append((ctx.args["compensates"], ctx.args["result"]))
            return f"undid {what}"

        return compensate

    def credit(input: Any, ctx: JobContext) -> None:
        raise Discard("the receiving account is closed")

    worker.workflow(
        "transfer",
        [
            ("reserve", lambda input, ctx: {"hold": input["amount"]}),
            ("debit", lambda input, ctx: {"debited": input["amount"]}),
            ("credit", credit),
            Compensation("release", undo("reserve"), undoes="reserve"),
            Compensation("refund", undo("debit"), undoes="debit"),
        ],
    )
    worker.start()
    assert conn.execute("SELECT compensations FROM treadle.workflows WHERE name = 'transfer'").fetchone() == (
        {"reserve": "release", "debit": "refund"},
    )
    run_id = start_workflow(conn, "transfer", {"amount": 100})
    with pytest.raises(treadle.WorkflowFailed) as failed:
        treadle.wait_workflow(dsn, run_id, timeout=30)
    assert failed.value.step == "credit"
    assert "closed" in (failed.value.error or "")
    assert undone == [("debit", {"debited": 100}), ("reserve", {"hold": 100})]
    finished = run(conn, run_id)
    assert finished["state"] == "compensated"
    assert finished["results"]["refund"] == "undid debit"
    assert finished["results"]["release"] == "undid reserve"


def test_start_workflow_takes_compensations(conn: psycopg.Connection[Any]) -> None:
    run_id = treadle.start_workflow(conn, "adhoc", steps=["a", "b"], compensations={"a": "undo_a"})
    assert conn.execute("SELECT compensations FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone() == (
        {"a": "undo_a"},
    )
    with pytest.raises(InvalidArgument, match="compensations must be a mapping"):
        treadle.start_workflow(conn, "adhoc", steps=["a"], compensations=["a"])  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument, match='is named "b", as a step is'):
        treadle.start_workflow(conn, "adhoc", steps=["a", "b"], compensations={"a": "b"})


def test_a_bad_compensation_is_refused_when_it_is_registered(make_worker: MakeWorker) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument, match="which is not one of its steps"):
        worker.workflow("bad", [("a", lambda i, c: 1), Compensation("undo", lambda i, c: 1, undoes="b")])
    with pytest.raises(InvalidArgument, match="a step and a compensation named"):
        worker.workflow("bad", [("a", lambda i, c: 1), Compensation("a", lambda i, c: 1, undoes="a")])
