"""A worker's own metrics, fed by the events of a real Worker running real jobs."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from prometheus_client import generate_latest

from tests.metrics.scraping import Sample, named, parse, value
from tests.metrics.worker_process import one_row
from treadle.metrics import WorkerMetrics
from treadle.worker import Worker

PATIENCE = 60.0


def wait_for_state(conn: psycopg.Connection[Any], state: str, count: int) -> None:
    deadline = time.monotonic() + PATIENCE
    while conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = %s", (state,)).fetchone() != (count,):
        assert time.monotonic() < deadline, f"timed out waiting for {count} {state} jobs"
        time.sleep(0.05)


def test_outcomes_histograms_and_slots(dsn: str, conn: psycopg.Connection[Any]) -> None:
    metrics = WorkerMetrics()

    def send(args: Any, ctx: Any) -> str:
        time.sleep(0.2)
        return "sent"

    def boom(args: Any, ctx: Any) -> None:
        raise ValueError("boom")

    worker = Worker(
        dsn,
        ["mail"],
        concurrency=3,
        poll_interval=0.1,
        lease=5,
        heartbeat_interval=1,
        backoff=lambda attempt: 0,
        on_event=metrics.observe,
    )

    def scrape() -> dict[Sample, float]:
        return parse(generate_latest(metrics.registry).decode())

    worker.register("send", send)
    worker.register("boom", boom)
    metrics.track_slots(lambda: worker.busy_handlers, worker.concurrency)
    for _ in range(3):
        conn.execute("SELECT treadle.enqueue('send', queue => 'mail')")
    conn.execute("SELECT treadle.enqueue('boom', queue => 'mail', max_attempts => 2)")
    outcomes = {
        (("name", "send"), ("outcome", "completed"), ("queue", "mail")): 3,
        (("name", "boom"), ("outcome", "failed"), ("queue", "mail")): 1,
        (("name", "boom"), ("outcome", "discarded"), ("queue", "mail")): 1,
    }
    with worker:
        wait_for_state(conn, "completed", 3)
        wait_for_state(conn, "discarded", 1)
        # a finish's event follows its commit: the rows can be seen before the worker counts them
        deadline = time.monotonic() + PATIENCE
        while (counted := named(samples := scrape(), "treadle_worker_jobs_total")) != outcomes:
            assert time.monotonic() < deadline, counted
            time.sleep(0.05)
    # every run's claim-to-start and run time, the sleeps of `send` among them
    assert value(samples, "treadle_worker_claim_to_start_seconds_count", queue="mail", name="send") == 3
    assert value(samples, "treadle_worker_claim_to_start_seconds_count", queue="mail", name="boom") == 2
    assert value(samples, "treadle_worker_run_seconds_count", queue="mail", name="send") == 3
    assert value(samples, "treadle_worker_run_seconds_count", queue="mail", name="boom") == 2
    send_total = value(samples, "treadle_worker_run_seconds_sum", queue="mail", name="send")
    assert send_total is not None and send_total >= 0.6
    assert value(samples, "treadle_worker_run_seconds_bucket", queue="mail", name="send", le="0.1") == 0
    assert value(samples, "treadle_worker_run_seconds_bucket", queue="mail", name="send", le="+Inf") == 3
    assert value(samples, "treadle_worker_slots") == 3
    assert value(samples, "treadle_worker_busy_slots") == 0
    assert value(samples, "treadle_worker_lease_losses_total", queue="mail", name="send") is None


def test_rescued_counts_what_rescue_returned() -> None:
    metrics = WorkerMetrics()
    metrics.rescued(0)
    metrics.rescued(4)
    metrics.rescued(1)
    assert value(parse(generate_latest(metrics.registry).decode()), "treadle_worker_rescued_jobs_total") == 5


def test_a_lost_lease_is_counted_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    metrics = WorkerMetrics()

    def hold(args: Any, ctx: Any) -> str:
        ctx.cancelled.wait(PATIENCE)  # holds on until its lease is taken from it
        return "too late"

    worker = Worker(dsn, ["mail"], poll_interval=0.1, lease=2, heartbeat_interval=0.2, on_event=metrics.observe)
    worker.register("hold", hold)
    conn.execute("SELECT treadle.enqueue('hold', queue => 'mail')")
    with worker:
        wait_for_state(conn, "running", 1)
        # an hour later by treadle's clock the lease has expired: a rescue returns the job,
        # and another worker claims and completes it
        conn.execute("SELECT set_config('treadle.now', (now() + interval '1 hour')::text, false)")
        assert conn.execute("SELECT treadle.rescue()").fetchone() == (1,)
        job_id, token = one_row(conn, "SELECT id, lease_token FROM treadle.claim('thief', ARRAY['mail'])")
        assert conn.execute("SELECT treadle.complete(%s, %s)", (job_id, token)).fetchone() == ("completed",)
        conn.execute("RESET treadle.now")
        deadline = time.monotonic() + PATIENCE
        while (
            value(
                parse(generate_latest(metrics.registry).decode()),
                "treadle_worker_lease_losses_total",
                queue="mail",
                name="hold",
            )
            != 1
        ):
            assert time.monotonic() < deadline, "the lost lease was never counted"
            time.sleep(0.05)
        samples = parse(generate_latest(metrics.registry).decode())

    assert value(samples, "treadle_worker_claim_to_start_seconds_count", queue="mail", name="hold") == 1
    # nothing of the run was written, and a lost run has no run time
    assert named(samples, "treadle_worker_jobs_total") == {}
    assert value(samples, "treadle_worker_run_seconds_count", queue="mail", name="hold") is None
