"""A claimed job as handlers and event hooks see it: every field what its row holds, also
those the worker keeps in one record until something reads one (_executor.DeferredLoader)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.worker.worker_support import PATIENCE, enqueue, until_state
from treadle import JobContext, Worker, WorkerEvent, get_job
from treadle.models import DEFERRED_KEY, Job

# text that a record's text form has to quote, double or escape
AWKWARD = "a \"quoted\", comma\\backslash (paren) {brace} 'apostrophe', ünïcode"
MULTILINE = AWKWARD + "\nsecond line"  # a key and a progress note take no control character


def _row(dsn: str, job_id: int, lease_token: Any) -> Job:
    """The job as the client reads it (treadle.job_details), with the lease token it leaves out."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = get_job(conn, job_id)
    assert row is not None
    return dataclasses.replace(row, lease_token=lease_token)


def test_a_claimed_jobs_fields_are_its_rows_also_the_deferred_ones(
    conn: psycopg.Connection[Any], dsn: str, make_worker: Any
) -> None:
    """A second attempt, so that the row has an error, its errors and a failure time; a key,
    a period, a timeout, a backoff and meta that need quoting inside a record."""
    events: list[WorkerEvent] = []
    worker: Worker = make_worker(on_event=events.append)
    seen: dict[str, Any] = {}
    done = threading.Event()

    @worker.register("awkward")
    def awkward(args: Any, ctx: JobContext) -> None:
        if ctx.attempt == 1:
            ctx.progress(0.25, AWKWARD)
            raise RuntimeError(MULTILINE)
        job = ctx.job
        seen["deferred"] = DEFERRED_KEY in vars(job)
        seen["pickled"] = pickle.dumps(job)  # before anything read a deferred field
        seen["copied"] = copy.copy(ctx.job)
        seen["row"] = _row(dsn, ctx.job_id, ctx.lease_token)
        seen["job"] = job
        done.set()

    job_id = enqueue(
        conn,
        "awkward",
        {"text": MULTILINE},
        priority=-3,
        max_attempts=5,
        idempotency_key=AWKWARD,
        every=timedelta(days=1, hours=2, microseconds=5),
        timeout=timedelta(minutes=5),
        backoff=[timedelta(0), timedelta(hours=1, seconds=0.5)],
        meta=Jsonb({"note": MULTILINE}),
    )
    worker.start()
    assert done.wait(PATIENCE)
    until_state(conn, job_id, "completed")
    assert seen["deferred"], "the claim kept the other fields in their record"
    row: Job = seen["row"]
    for kept in (seen["job"], seen["copied"], pickle.loads(seen["pickled"])):
        assert type(kept) is Job
        assert repr(kept) == repr(row)  # every field, its type and a timestamp's zone
        assert kept == row
        assert DEFERRED_KEY not in vars(kept)
    # the record held what needed quoting, and the row had something in each
    assert row.last_error is not None and MULTILINE in row.last_error
    assert row.idempotency_key == AWKWARD  # (a claim clears the progress of the attempt before)
    assert row.backoff == [timedelta(0), timedelta(hours=1, seconds=0.5)]
    assert isinstance(row.failed_at, datetime) and isinstance(row.errors, list) and len(row.errors) == 1
    assert row.every == timedelta(days=1, hours=2, microseconds=5) and row.cancel_requested is False
    # the events' job is the handler's own
    assert any(event.kind == "started" and event.job is seen["job"] for event in events)


def test_a_claimed_jobs_null_fields_and_a_read_from_two_threads(
    conn: psycopg.Connection[Any], dsn: str, make_worker: Any
) -> None:
    """A first attempt with every optional field null; two threads reading a deferred field at once."""
    worker: Worker = make_worker()
    seen: dict[str, Any] = {}
    done = threading.Event()

    @worker.register("plain")
    def plain(args: Any, ctx: JobContext) -> None:
        job = ctx.job
        barrier = threading.Barrier(2)
        values: list[Any] = []

        def read() -> None:
            barrier.wait()
            values.append((job.created_at, job.errors, job.state))

        threads = [threading.Thread(target=read) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seen["values"] = values
        seen["row"] = _row(dsn, ctx.job_id, ctx.lease_token)
        seen["job"] = job
        done.set()

    job_id = enqueue(conn, "plain")
    worker.start()
    assert done.wait(PATIENCE)
    until_state(conn, job_id, "completed")
    row: Job = seen["row"]
    assert repr(seen["job"]) == repr(row) and seen["job"] == row
    assert seen["values"] == [(row.created_at, [], "running")] * 2
    assert (row.result, row.last_error, row.every, row.backoff, row.meta, row.progress) == (None,) * 6


@pytest.mark.parametrize("name", ["state", "run_at", "every", "meta", "lease_token", "id"])
def test_the_class_keeps_its_defaults_and_has_no_value_for_a_field_without_one(name: str) -> None:
    field = {f.name: f for f in dataclasses.fields(Job)}[name]
    if field.default is dataclasses.MISSING:
        assert not hasattr(Job, name)
    else:
        assert getattr(Job, name) == field.default


class _Interleaved(dict):  # type: ignore[type-arg]
    """A claimed job's __dict__ that runs `between` at the moment a read of a deferred field,
    having not found it in the dict, looks for the deferred record: as when another thread
    takes the fields apart between those two steps of this thread's read."""

    between: Any = None

    def get(self, key: Any, default: Any = None) -> Any:
        step, self.between = self.between, None
        if key == DEFERRED_KEY and step is not None:
            step()
        return super().get(key, default)


def test_a_deferred_field_read_while_another_thread_takes_them_apart(conn: psycopg.Connection[Any]) -> None:
    """A read that missed the field in the job's dict, while another thread's read fills the dict
    and drops the record before this one looks for it, still gets the field (it raised
    AttributeError)."""
    from treadle._executor import DeferredLoader, decode_claimed
    from treadle._producer import claim_statements

    job_id = enqueue(conn, "interleaved")
    claim, _ = claim_statements("w", ["default"], ["interleaved"], timedelta(seconds=30))
    query, params = claim.query(True, {"batch": 1, "lease_token": None})
    with conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:
        (row,) = cur.execute(query, params).fetchall()
    job = decode_claimed(row, DeferredLoader(conn)).job
    assert job.id == job_id and DEFERRED_KEY in vars(job)
    other: list[Any] = []
    interleaved = _Interleaved(vars(job))
    interleaved.between = lambda: other.append(job.created_at)  # the other thread's read, whole
    object.__setattr__(job, "__dict__", interleaved)
    assert job.state == "running"
    assert other and other[0] == job.created_at
    assert DEFERRED_KEY not in vars(job)
