"""Child workflows in a worker: a Child step starts a run of another registered workflow,
the parent goes on with its results, and wait_workflow on the parent returns only when
the parent and its children are done."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import treadle
from tests.worker.worker_support import run, start_workflow
from treadle import Child, InvalidArgument, JobContext, Worker

MakeWorker = Callable[..., Worker]


def test_a_child_workflow_runs_and_its_parent_goes_on_with_its_results(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker
) -> None:
    worker = make_worker(queues=["default", "payments"])
    worker.workflow(
        "charge",
        [
            ("authorize", lambda input, ctx: {"auth": f"A-{input['reserve']['item']}"}),
            ("capture", lambda input, ctx: {"captured": ctx.results["authorize"]["auth"]}),
        ],
    )
    worker.workflow(
        "order",
        [
            ("reserve", lambda input, ctx: {"item": input["item"]}),
            Child("pay", "charge", queue="payments"),
            ("ship", lambda input, ctx: f"shipped after {ctx.results['pay']['capture']['captured']}"),
        ],
    )
    worker.start()
    assert conn.execute("SELECT children FROM treadle.workflows WHERE name = 'order'").fetchone() == (
        {"pay": {"workflow": "charge", "queue": "payments"}},
    )
    run_id = start_workflow(conn, "order", {"item": 7})
    results = treadle.wait_workflow(dsn, run_id, timeout=30)
    assert results["ship"] == "shipped after A-7"
    assert results["pay"] == {"authorize": {"auth": "A-7"}, "capture": {"captured": "A-7"}}
    child = conn.execute(
        "SELECT queue, state, parent_step FROM treadle.workflow_runs WHERE parent_run_id = %s", [run_id]
    ).fetchall()
    assert child == [("payments", "completed", "pay")]


def test_wait_workflow_on_a_cancelled_parent_waits_for_its_child(
    conn: psycopg.Connection[Any], dsn: str, make_worker: MakeWorker
) -> None:
    """The parent's pending step is cancelled at once, so the parent ends before its child,
    whose running step learns of the cancel only when it finishes."""
    worker = make_worker(queues=["kids"])  # the parent's own step, in queue parents, waits
    started, release = threading.Event(), threading.Event()

    def slow(input: Any, ctx: JobContext) -> str:
        started.set()
        release.wait(30)
        return "slow"

    worker.workflow("slowkid", [("slow", slow)])
    worker.start()
    row = conn.execute(
        "SELECT treadle.start_workflow('parent', steps => array['kid', 'other'], queue => 'parents', after => '{}',"
        ' children => \'{"kid": {"workflow": "slowkid", "queue": "kids"}}\')'
    ).fetchone()
    assert row is not None
    run_id = int(row[0])
    assert started.wait(30)
    assert conn.execute("SELECT treadle.cancel_workflow(%s)", [run_id]).fetchone() == (True,)
    assert run(conn, run_id)["state"] == "cancelled"
    with pytest.raises(treadle.WaitTimeout):
        treadle.wait_workflow(dsn, run_id, timeout=0.5)  # the child's step still runs
    release.set()
    with pytest.raises(treadle.WorkflowCancelled):
        treadle.wait_workflow(dsn, run_id, timeout=30)
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE parent_run_id = %s", [run_id]).fetchone() == (
        "cancelled",
    )
    assert run(conn, run_id)["results"] == {}


def test_a_bad_child_step_is_refused_when_it_is_registered(make_worker: MakeWorker) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument, match="child workflow name"):
        worker.workflow("bad", [Child("a", "")])
    with pytest.raises(InvalidArgument, match="repeats the step name"):
        worker.workflow("bad", [("a", lambda i, c: 1), Child("a", "other")])


def test_start_workflow_takes_children_by_name_or_spec(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT treadle.define_workflow('kid', array['k'])")
    run_id = treadle.start_workflow(
        conn,
        "client",
        {"n": 1},
        steps=["a", "b"],
        after={"b": []},
        children={"a": "kid", "b": {"workflow": "kid", "queue": "elsewhere"}},
    )
    kids = conn.execute(
        "SELECT parent_step, name, queue, input FROM treadle.workflow_runs WHERE parent_run_id = %s ORDER BY id",
        [run_id],
    ).fetchall()
    assert kids == [("a", "kid", "default", {"n": 1}), ("b", "kid", "elsewhere", {"n": 1})]
    with pytest.raises(InvalidArgument, match="children must be a mapping"):
        treadle.start_workflow(conn, "client", steps=["a"], children=["a"])  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument, match='child step "a" must be'):  # 22023 from the database
        treadle.start_workflow(conn, "client", steps=["a"], children={"a": {"workflow": "kid", "priority": "1"}})
