"""start_workflow, cancel, retry, cancel_workflow, explain_run, get_job, workflow_results, version."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle
from tests.client.producer_support import SqlWorker
from tests.conftest import EXTENSION_VERSION


def test_get_job_reads_every_column(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    job_id = treadle.enqueue(conn, "resize", {"w": 10}, queue="img", priority=2, max_attempts=3)
    job = treadle.get_job(conn, job_id)
    assert job is not None
    assert (job.id, job.name, job.args, job.queue, job.priority, job.max_attempts) == (
        job_id,
        "resize",
        {"w": 10},
        "img",
        2,
        3,
    )
    assert (job.state, job.attempt, job.finished, job.result) == ("available", 0, False, None)
    sql_worker.complete(job_id, {"ok": True, "pixels": [1, 2]})
    done = treadle.get_job(conn, job_id)
    assert done is not None and done.state == "completed" and done.finished
    assert done.result == {"ok": True, "pixels": [1, 2]} and done.attempt == 1 and done.worker_id == "test-worker"


def test_get_job_of_an_unknown_id(conn: psycopg.Connection[Any]) -> None:
    assert treadle.get_job(conn, 123456) is None


def test_cancel_and_retry(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    job_id = treadle.enqueue(conn, "x")
    assert treadle.cancel(conn, job_id) is True
    assert treadle.cancel(conn, job_id) is False  # already finished
    job = treadle.get_job(conn, job_id)
    assert job is not None and job.state == "cancelled"
    assert treadle.retry(conn, job_id) is True
    job = treadle.get_job(conn, job_id)
    assert job is not None and (job.state, job.attempt) == ("available", 0)
    assert treadle.retry(conn, job_id) is False  # available: nothing to retry
    sql_worker.claim(job_id)
    assert treadle.cancel(conn, job_id) is True  # running: a cancel request
    assert treadle.cancel(conn, job_id) is False  # requested already
    job = treadle.get_job(conn, job_id)
    assert job is not None and job.state == "running" and job.cancel_requested


def test_cancel_and_retry_of_unknown_ids(conn: psycopg.Connection[Any]) -> None:
    assert treadle.cancel(conn, 999) is False
    assert treadle.retry(conn, 999) is False
    assert treadle.cancel_workflow(conn, 999) is False
    assert treadle.workflow_results(conn, 999) is None


def test_start_workflow_with_steps_and_options(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    run_id = treadle.start_workflow(
        conn, "checkout", {"cart": 5}, steps=("reserve", "charge"), queue="shop", priority=4, max_attempts=2
    )
    run = conn.execute(
        "SELECT name, input, steps, queue, priority, max_attempts, state FROM treadle.workflow_runs WHERE id = %s",
        [run_id],
    ).fetchone()
    assert run == ("checkout", {"cart": 5}, ["reserve", "charge"], "shop", 4, 2, "running")
    step = conn.execute(
        "SELECT id, name, step, queue, priority, max_attempts FROM treadle.jobs WHERE workflow_run_id = %s", [run_id]
    ).fetchone()
    assert step is not None and step[1:] == ("workflow:checkout/reserve", "reserve", "shop", 4, 2)
    assert treadle.workflow_results(conn, run_id) == {}
    sql_worker.complete(step[0], {"hold": "h1"})
    assert treadle.workflow_results(conn, run_id) == {"reserve": {"hold": "h1"}}


def test_start_workflow_with_a_graph(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    run_id = treadle.start_workflow(conn, "etl", steps=["a", "b", "join"], after={"join": ["a", "b"]}, queue="etl")
    assert conn.execute("SELECT after FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone() == (
        {"a": [], "b": [], "join": ["a", "b"]},
    )
    steps = conn.execute(
        "SELECT id, step FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id", [run_id]
    ).fetchall()
    assert [step for _, step in steps] == ["a", "b"]
    for job_id, step in steps:
        sql_worker.complete(job_id, step.upper())
    assert conn.execute(
        "SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id", [run_id]
    ).fetchall() == [("a", "completed"), ("b", "completed"), ("join", "available")]
    assert treadle.workflow_results(conn, run_id) == {"a": "A", "b": "B"}
    # what each step receives: the join both branches' results, a branch none
    assert treadle.workflow_step_results(conn, run_id, "join") == {"a": "A", "b": "B"}
    assert treadle.workflow_step_results(conn, run_id, "a") == {}


def test_workflow_step_results_of_a_list(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    """A list's step receives every earlier step's result and no later one's; a step the run lacks
    receives nothing; an unknown run gives None."""
    run_id = treadle.start_workflow(conn, "trip", steps=["book", "pay", "mail"], queue="trips")
    for result in ({"seat": "2A"}, {"paid": 120}):
        ((job_id,),) = conn.execute(
            "SELECT id FROM treadle.jobs WHERE workflow_run_id = %s AND state = 'available'", [run_id]
        ).fetchall()
        sql_worker.complete(job_id, result)
    assert treadle.workflow_step_results(conn, run_id, "mail") == {"book": {"seat": "2A"}, "pay": {"paid": 120}}
    assert treadle.workflow_step_results(conn, run_id, "pay") == {"book": {"seat": "2A"}}
    assert treadle.workflow_step_results(conn, run_id, "book") == {}
    assert treadle.workflow_step_results(conn, run_id, "refund") == {}
    assert treadle.workflow_step_results(conn, 999_999, "mail") is None


def test_start_workflow_with_a_sleep(conn: psycopg.Connection[Any]) -> None:
    run_id = treadle.start_workflow(conn, "nap", steps=["zz", "wake"], sleeps={"zz": timedelta(hours=1)})
    assert conn.execute(
        "SELECT sleeps, wakes IS NOT NULL, wake_at > now() FROM treadle.workflow_runs WHERE id = %s", [run_id]
    ).fetchone() == ({"zz": "01:00:00"}, True, True)
    assert conn.execute("SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = %s", [run_id]).fetchone() == (0,)


def test_start_workflow_uses_the_registered_definition(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT treadle.define_workflow('signup', ARRAY['create', 'welcome'])")
    run_id = treadle.start_workflow(conn, "signup")
    assert conn.execute("SELECT steps, input FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone() == (
        ["create", "welcome"],
        {},
    )


def test_start_workflow_idempotency_key(conn: psycopg.Connection[Any]) -> None:
    first = treadle.start_workflow(conn, "w", steps=["a"], idempotency_key="order:1")
    again = treadle.start_workflow(conn, "w", {"other": True}, steps=["a"], idempotency_key="order:1")
    # workflow keys are a namespace apart from jobs' keys
    job_id = treadle.enqueue(conn, "x", idempotency_key="order:1")
    assert first == again
    assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM treadle.jobs WHERE id = %s AND step IS NULL", [job_id]).fetchone() == (1,)


def test_cancel_workflow(conn: psycopg.Connection[Any]) -> None:
    run_id = treadle.start_workflow(conn, "w", steps=["a", "b"])
    assert treadle.cancel_workflow(conn, run_id) is True
    assert treadle.cancel_workflow(conn, run_id) is False
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone() == ("cancelled",)


def test_explain_run(conn: psycopg.Connection[Any]) -> None:
    run_id = treadle.start_workflow(
        conn, "gate", steps=["wait", "ship"], waits={"wait": {"signal": "go", "timeout": timedelta(hours=1)}}
    )
    reasons = treadle.explain_run(conn, run_id)
    assert [(r.step, r.reason) for r in reasons] == [(None, "run"), ("wait", "signal"), ("ship", "dependencies")]
    assert reasons[0].message.startswith(f"run {run_id} of workflow gate on queue default is running since ")
    assert reasons[1].message.startswith("wait step wait waits for signal go until ")
    assert reasons[1].at is not None and reasons[1].job_id is None
    assert reasons[2].message == "step ship waits for its dependencies to complete: wait"
    assert treadle.cancel_workflow(conn, run_id) is True
    assert [r.reason for r in treadle.explain_run(conn, run_id)] == ["run"]


def test_explain_run_of_an_unknown_or_bad_id(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(treadle.WorkflowNotFound, match="no workflow run with id 999999"):
        treadle.explain_run(conn, 999999)
    with pytest.raises(treadle.InvalidArgument, match="run_id must be an integer"):
        treadle.explain_run(conn, "7")  # type: ignore[call-overload]


def test_explain_run_async(dsn: str) -> None:
    async def scenario() -> list[treadle.RunExplanation]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            run_id = await treadle.start_workflow(aconn, "w", steps=["a"])
            return await treadle.explain_run(aconn, run_id)

    reasons = asyncio.run(scenario())
    assert [(r.step, r.reason) for r in reasons] == [(None, "run"), ("a", "no_worker")]
    assert reasons[1].job_id is not None


def test_version(conn: psycopg.Connection[Any]) -> None:
    assert treadle.version(conn) == EXTENSION_VERSION


def test_calls_honour_no_row_factory_of_the_callers(dsn: str) -> None:
    # the caller's connection may return dicts or anything else; treadle reads its own way
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.namedtuple_row) as conn:
        job_id = treadle.enqueue(conn, "x")
        job = treadle.get_job(conn, job_id)
        assert job is not None and job.id == job_id
        assert treadle.enqueue_many(conn, [{"name": "y"}]) == [job_id + 1]


@pytest.mark.parametrize("autocommit", [True, False])
def test_reads_follow_the_callers_transaction(dsn: str, autocommit: bool) -> None:
    with psycopg.connect(dsn, autocommit=autocommit) as conn, conn.transaction():
        job_id = treadle.enqueue(conn, "mine")
        # the caller sees its own uncommitted job; nobody else does yet
        job = treadle.get_job(conn, job_id)
        assert job is not None and job.state == "available"
        with psycopg.connect(dsn) as other:
            assert treadle.get_job(other, job_id) is None


def _step_job(conn: psycopg.Connection[Any], run_id: int, step: str) -> int:
    row = conn.execute(
        "SELECT id FROM treadle.jobs WHERE workflow_run_id = %s AND step = %s ORDER BY id DESC LIMIT 1", [run_id, step]
    ).fetchone()
    assert row is not None
    return int(row[0])


def _run(conn: psycopg.Connection[Any], run_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT state, results, forked_from, forked_step FROM treadle.workflow_runs WHERE id = %s", [run_id]
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_retry_run_and_fork_run(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    run_id = treadle.start_workflow(conn, "order", {"n": 1}, steps=["reserve", "charge"], max_attempts=1)
    sql_worker.complete(_step_job(conn, run_id, "reserve"), {"r": 1})
    assert sql_worker.fail(_step_job(conn, run_id, "charge"), "card declined") == "discarded"
    assert _run(conn, run_id)[0] == "failed"

    assert treadle.retry_run(conn, run_id) == "running"
    sql_worker.complete(_step_job(conn, run_id, "charge"), {"c": 2})
    assert _run(conn, run_id) == ("completed", {"reserve": {"r": 1}, "charge": {"c": 2}}, None, None)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="only a failed or cancelled run"):
        treadle.retry_run(conn, run_id)

    fork = treadle.fork_run(conn, run_id, "charge", input={"n": 2})
    assert _run(conn, fork) == ("running", {"reserve": {"r": 1}}, run_id, "charge")
    sql_worker.complete(_step_job(conn, fork, "charge"), {"c": 3})
    assert _run(conn, fork)[:2] == ("completed", {"reserve": {"r": 1}, "charge": {"c": 3}})


def test_retry_run_and_fork_run_refuse_bad_input(conn: psycopg.Connection[Any]) -> None:
    run_id = treadle.start_workflow(conn, "order", steps=["reserve", "charge"])
    runs = conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone()
    with pytest.raises(psycopg.errors.NoDataFound, match="no workflow run has id 999999"):
        treadle.retry_run(conn, 999999)
    with pytest.raises(psycopg.errors.NoDataFound):
        treadle.fork_run(conn, 999999, "reserve")
    with pytest.raises(treadle.InvalidArgument, match='has no step "ship"'):
        treadle.fork_run(conn, run_id, "ship")
    with pytest.raises(treadle.InvalidArgument, match="run_id must be an integer"):
        treadle.retry_run(conn, "7")  # type: ignore[call-overload]
    with pytest.raises(treadle.InvalidArgument):
        treadle.fork_run(conn, run_id, "reserve", input="text")
    assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == runs


def test_retry_run_and_fork_run_async(dsn: str) -> None:
    async def go() -> tuple[str, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            run_id = await treadle.start_workflow(aconn, "w", steps=["a", "b"])
            await treadle.cancel_workflow(aconn, run_id)
            return await treadle.retry_run(aconn, run_id), await treadle.fork_run(aconn, run_id, "b")

    state, fork = asyncio.run(go())
    assert state == "running" and fork > 0


def test_compensate_run(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    run_id = treadle.start_workflow(conn, "saga", steps=["debit", "credit"], compensations={"debit": "refund"})
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="only a cancelled run"):
        treadle.compensate_run(conn, run_id)
    sql_worker.complete(_step_job(conn, run_id, "debit"), {"id": 1})
    assert treadle.cancel_workflow(conn, run_id) is True
    assert treadle.compensate_run(conn, run_id) == "compensating"
    sql_worker.complete(_step_job(conn, run_id, "refund"), "refunded")
    assert _run(conn, run_id)[:2] == ("compensated", {"debit": {"id": 1}, "refund": "refunded"})
    with pytest.raises(psycopg.errors.NoDataFound):
        treadle.compensate_run(conn, 999999)


def test_cancel_run_with_compensate(conn: psycopg.Connection[Any], sql_worker: SqlWorker) -> None:
    run_id = treadle.start_workflow(conn, "saga", steps=["debit", "credit"], compensations={"debit": "refund"})
    sql_worker.complete(_step_job(conn, run_id, "debit"), {"id": 1})
    assert treadle.cancel_run(conn, run_id, compensate=True) == "compensating"
    sql_worker.complete(_step_job(conn, run_id, "refund"), "refunded")
    assert _run(conn, run_id)[:2] == ("compensated", {"debit": {"id": 1}, "refund": "refunded"})
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="only a running or cancelled run"):
        treadle.cancel_run(conn, run_id, compensate=True)
    plain = treadle.start_workflow(conn, "plain", steps=["a", "b"])
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="has no compensations"):
        treadle.cancel_run(conn, plain, compensate=True)
    assert treadle.cancel_run(conn, plain) == "cancelled"
    with pytest.raises(psycopg.errors.NoDataFound):
        treadle.cancel_run(conn, 999999, compensate=True)
    with pytest.raises(treadle.InvalidArgument):
        treadle.cancel_run(conn, plain, compensate="yes")  # type: ignore[call-overload]
