"""What a handler's JobContext does: cancellation, heartbeats, lost leases, complete_in."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.worker.worker_support import LEASE, PATIENCE, enqueue, job, until_state, wait_for
from treadle import InvalidArgument, JobContext, LeaseLost, Worker, WorkerEvent

MakeWorker = Callable[..., Worker]


def steal(dsn: str, job_id: int) -> UUID:
    """Take a running job over as another worker would after its lease expired.

    The session moves treadle's clock an hour ahead (treadle.now), so rescue() finds
    the lease expired; then it claims the job as worker 'thief'.
    """
    with psycopg.connect(dsn, autocommit=True) as thief:
        thief.execute("SELECT set_config('treadle.now', (now() + interval '1 hour')::text, false)")
        assert thief.execute("SELECT treadle.rescue()").fetchone() == (1,)
        row = thief.execute("SELECT id, lease_token FROM treadle.claim('thief')").fetchone()
    assert row is not None and row[0] == job_id
    return UUID(str(row[1]))


def kinds(events: list[WorkerEvent]) -> list[str]:
    return [event.kind for event in events]


def test_a_cancel_reaches_a_running_sync_handler(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    events: list[WorkerEvent] = []
    worker = make_worker(on_event=events.append)
    started = threading.Event()
    seen: dict[str, Any] = {}

    @worker.register
    def export(args: Any, ctx: JobContext) -> str:
        started.set()
        seen["fired"] = ctx.cancelled.wait(PATIENCE)
        seen["requested"] = ctx.cancel_requested
        ctx.check_cancelled()
        return "exported anyway"

    job_id = enqueue(conn, "export")
    worker.start()
    assert started.wait(PATIENCE)
    assert conn.execute("SELECT treadle.cancel(%s)", [job_id]).fetchone() == (True,)
    row = until_state(conn, job_id, "cancelled")
    assert seen == {"fired": True, "requested": True}
    assert f"job {job_id} was cancelled" in row["last_error"]
    wait_for(lambda: "cancelled" in kinds(events), "the cancelled event")
    assert "completed" not in kinds(events)


def test_a_cancel_aborts_an_async_handler_at_its_await(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    started = threading.Event()
    aborted = threading.Event()

    @worker.register
    async def crawl(args: Any, ctx: JobContext) -> str:
        started.set()
        try:
            await asyncio.sleep(PATIENCE)
        except asyncio.CancelledError:
            aborted.set()
            raise
        return "crawled"

    job_id = enqueue(conn, "crawl")
    worker.start()
    assert started.wait(PATIENCE)
    conn.execute("SELECT treadle.cancel(%s)", [job_id])
    row = until_state(conn, job_id, "cancelled")
    assert aborted.is_set()
    assert row["result"] is None


def test_heartbeats_keep_a_long_job_past_its_lease(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    rescuer = make_worker(rescue_interval=0.1)  # rescues all the while, in the same database
    rescuer.register("unrelated", lambda args, ctx: None)

    @worker.register
    def slow(args: Any, ctx: JobContext) -> str:
        time.sleep(3 * LEASE)
        return ctx.heartbeat()

    job_id = enqueue(conn, "slow")
    rescuer.start()
    worker.start()
    row = until_state(conn, job_id, "completed")
    assert (row["result"], row["attempt"], row["errors"]) == ("held", 1, [])


def test_a_lost_lease_sets_cancelled_and_nothing_is_written(
    dsn: str, conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    events: list[WorkerEvent] = []
    worker = make_worker(on_event=events.append)
    started = threading.Event()
    seen: dict[str, Any] = {}

    @worker.register
    def render(args: Any, ctx: JobContext) -> str:
        started.set()
        seen["fired"] = ctx.cancelled.wait(PATIENCE)
        seen["lost"] = ctx.lease_lost
        with pytest.raises(LeaseLost, match="the lease was lost"):
            ctx.check_cancelled()
        seen["checked"] = True
        return "a stale result"

    job_id = enqueue(conn, "render")
    worker.start()
    assert started.wait(PATIENCE)
    thief_token = steal(dsn, job_id)
    wait_for(lambda: worker.running_jobs == 0, "the handler to finish")
    assert seen == {"fired": True, "lost": True, "checked": True}
    row = job(conn, job_id)
    assert (row["state"], row["worker_id"], row["lease_token"], row["result"]) == (
        "running",
        "thief",
        thief_token,
        None,
    )
    assert kinds(events) == ["claimed", "started", "lease_lost"]


LEDGER = "CREATE TABLE ledger (job_id bigint PRIMARY KEY, note text)"


def test_complete_in_commits_the_handlers_writes_with_the_completion(
    dsn: str, conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    conn.execute(LEDGER)
    events: list[WorkerEvent] = []
    worker = make_worker(on_event=events.append)

    @worker.register
    def transfer(args: Any, ctx: JobContext) -> None:
        with psycopg.connect(dsn) as own:  # autocommit off: one open transaction
            own.execute("INSERT INTO ledger VALUES (%s, 'moved')", [ctx.job_id])
            assert ctx.complete_in(own, {"moved": 10}) == "completed"

    job_id = enqueue(conn, "transfer")
    worker.start()
    row = until_state(conn, job_id, "completed")
    assert row["result"] == {"moved": 10}
    assert conn.execute("SELECT note FROM ledger WHERE job_id = %s", [job_id]).fetchone() == ("moved",)
    wait_for(lambda: worker.running_jobs == 0, "the job to settle")
    assert kinds(events) == ["claimed", "started", "completed"], "the worker did not complete it again"


def test_complete_in_rolls_back_the_handlers_writes_when_the_lease_is_lost(
    dsn: str, conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    conn.execute(LEDGER)
    events: list[WorkerEvent] = []
    worker = make_worker(on_event=events.append)
    written = threading.Event()
    go_on = threading.Event()
    outcome: list[str] = []

    @worker.register
    def transfer(args: Any, ctx: JobContext) -> None:
        with psycopg.connect(dsn) as own:
            own.execute("INSERT INTO ledger VALUES (%s, 'moved')", [ctx.job_id])
            written.set()
            go_on.wait(PATIENCE)
            try:
                ctx.complete_in(own, {"moved": 10})
            except LeaseLost as error:
                outcome.append(str(error))
                raise

    job_id = enqueue(conn, "transfer")
    worker.start()
    assert written.wait(PATIENCE)
    steal(dsn, job_id)
    go_on.set()
    wait_for(lambda: worker.running_jobs == 0, "the handler to finish")
    assert outcome == [f"job {job_id}: the lease was lost before complete_in; its writes were rolled back"]
    assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (0,)
    row = job(conn, job_id)
    assert (row["state"], row["worker_id"], row["result"], row["errors"][-1]["attempt"]) == (
        "running",
        "thief",
        None,
        1,
    )
    assert kinds(events).count("lease_lost") == 1
    assert "completed" not in kinds(events) and "failed" not in kinds(events)


def test_complete_in_joins_a_transaction_block(
    dsn: str, conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    conn.execute(LEDGER)
    worker = make_worker()

    @worker.register
    def transfer(args: Any, ctx: JobContext) -> None:
        with psycopg.connect(dsn, autocommit=True) as own, own.transaction():
            own.execute("INSERT INTO ledger VALUES (%s, 'in a block')", [ctx.job_id])
            ctx.complete_in(own, "done in the block")

    job_id = enqueue(conn, "transfer")
    worker.start()
    assert until_state(conn, job_id, "completed")["result"] == "done in the block"
    assert conn.execute("SELECT note FROM ledger").fetchone() == ("in a block",)


def test_complete_in_async_serves_async_handlers(
    dsn: str, conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    conn.execute(LEDGER)
    worker = make_worker()

    @worker.register
    async def transfer(args: Any, ctx: JobContext) -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as own:
            await own.execute("INSERT INTO ledger VALUES (%s, 'async')", [ctx.job_id])
            await ctx.complete_in_async(own, {"async": True})

    job_id = enqueue(conn, "transfer")
    worker.start()
    assert until_state(conn, job_id, "completed")["result"] == {"async": True}
    assert conn.execute("SELECT note FROM ledger").fetchone() == ("async",)


def test_complete_in_refuses_what_cannot_be_one_transaction(
    dsn: str, conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker()

    @worker.register
    def transfer(args: Any, ctx: JobContext) -> list[str]:
        refused = []
        with psycopg.connect(dsn, autocommit=True) as own:
            bad_calls: list[Callable[[], object]] = [
                lambda: ctx.complete_in(own),
                lambda: ctx.complete_in("a dsn"),  # type: ignore[arg-type]  # wrong on purpose
                lambda: ctx.complete_in(own.pgconn),  # type: ignore[arg-type]  # wrong on purpose
            ]
            for bad in bad_calls:
                try:
                    bad()
                except InvalidArgument as error:
                    refused.append(str(error))
        with psycopg.connect(dsn) as own:
            try:
                ctx.complete_in(own, {1, 2})
            except InvalidArgument as error:
                refused.append(str(error))
            own.rollback()
        return refused

    job_id = enqueue(conn, "transfer")
    worker.start()
    refused = until_state(conn, job_id, "completed")["result"]
    assert len(refused) == 4, "the job was still the worker's to complete"
    assert "complete_in needs the handler's writes in an open transaction" in refused[0]
    assert "complete_in needs a psycopg Connection, not str" in refused[1]
    assert "complete_in needs a psycopg Connection, not PGconn" in refused[2]
    assert "the job's result is a set, which JSON cannot hold" in refused[3]


def test_check_cancelled_is_quiet_while_the_job_runs(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()

    @worker.register
    def quiet(args: Any, ctx: JobContext) -> dict[str, Any]:
        ctx.check_cancelled()
        return {"beat": ctx.heartbeat(), "token": str(ctx.lease_token), "max": ctx.max_attempts}

    job_id = enqueue(conn, "quiet", max_attempts=3)
    worker.start()
    result = until_state(conn, job_id, "completed")["result"]
    assert result["beat"] == "held" and result["max"] == 3
    assert UUID(result["token"])
