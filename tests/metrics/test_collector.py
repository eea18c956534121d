"""The database collector, scraped against known jobs on the real test server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.metrics.scraping import named, parse, value
from treadle.metrics import DatabaseCollector, database_registry


def connector(dsn: str, role: str | None = None) -> Any:
    @contextmanager
    def connect() -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if role is not None:
                conn.execute(f'SET ROLE "{role}"')
            yield conn

    return connect


def scrape(registry: CollectorRegistry) -> dict[Any, float]:
    return parse(generate_latest(registry).decode())


def claim(
    conn: psycopg.Connection[Any], worker_id: str, queue: str, batch: int = 1, lease: str = "30 seconds"
) -> list[tuple[int, Any]]:
    return [
        (row[0], row[1])
        for row in conn.execute(
            "SELECT id, lease_token FROM treadle.claim(%s, ARRAY[%s], batch => %s, lease => %s::interval)",
            (worker_id, queue, batch, lease),
        ).fetchall()
    ]


@pytest.fixture
def known_jobs(conn: psycopg.Connection[Any]) -> None:
    """mail: 2 waiting (the oldest due 5 minutes ago), 1 running, 1 completed, 1 retryable;
    media: 1 waiting not yet due, 1 running with an expired lease. One live worker on mail."""
    for _ in range(4):
        conn.execute("SELECT treadle.enqueue('send', queue => 'mail', run_at => now() - interval '5 minutes')")
    conn.execute("SELECT treadle.enqueue('send', queue => 'mail')")
    (done, done_token), (failing, failing_token), _running = claim(conn, "w-mail", "mail", batch=3)
    assert conn.execute("SELECT treadle.complete(%s, %s)", (done, done_token)).fetchone() == ("completed",)
    assert conn.execute(
        "SELECT treadle.fail(%s, %s, 'boom', retry_in => '1 hour')", (failing, failing_token)
    ).fetchone() == ("retryable",)
    conn.execute("SELECT treadle.worker_seen('w-mail', 'host-a', 4242, ARRAY['mail'], 8, 1)")

    conn.execute("SELECT treadle.enqueue('resize', queue => 'media', run_at => now() + interval '1 hour')")
    conn.execute("SELECT treadle.enqueue('resize', queue => 'media', run_at => now() - interval '2 hours')")
    # claimed an hour ago by treadle's clock: its 30 s lease ran out long since
    conn.execute("SELECT set_config('treadle.now', (now() - interval '1 hour')::text, false)")
    assert len(claim(conn, "w-gone", "media")) == 1
    conn.execute("RESET treadle.now")


def test_counts_ages_workers_and_expired_leases(dsn: str, known_jobs: None) -> None:
    samples = scrape(database_registry(connector(dsn)))

    assert value(samples, "treadle_database_up") == 1
    assert named(samples, "treadle_jobs") == {
        (("queue", "mail"), ("state", "available")): 2,
        (("queue", "mail"), ("state", "running")): 1,
        (("queue", "mail"), ("state", "retryable")): 1,
        (("queue", "mail"), ("state", "completed")): 1,
        (("queue", "media"), ("state", "available")): 1,
        (("queue", "media"), ("state", "running")): 1,
    }
    oldest_mail = value(samples, "treadle_queue_oldest_waiting_seconds", queue="mail")
    assert oldest_mail is not None and 300 <= oldest_mail < 3600
    # media's only waiting job is not due yet: nothing waits
    assert value(samples, "treadle_queue_oldest_waiting_seconds", queue="media") == 0
    assert named(samples, "treadle_live_workers") == {(("queue", "mail"),): 1, (("queue", "media"),): 0}
    assert value(samples, "treadle_live_worker_slots", worker_id="w-mail", host="host-a") == 8
    assert value(samples, "treadle_live_worker_busy_slots", worker_id="w-mail", host="host-a") == 1
    assert value(samples, "treadle_expired_leases") == 1
    scrape_seconds = value(samples, "treadle_database_scrape_seconds")
    assert scrape_seconds is not None and scrape_seconds >= 0


def test_each_scrape_reads_the_database_anew(dsn: str, conn: psycopg.Connection[Any]) -> None:
    registry = database_registry(connector(dsn))
    assert named(scrape(registry), "treadle_jobs") == {}
    conn.execute("SELECT treadle.enqueue('send', queue => 'mail')")
    assert named(scrape(registry), "treadle_jobs") == {(("queue", "mail"), ("state", "available")): 1}


def test_a_scrape_reads_the_database_in_one_statement(dsn: str, known_jobs: None) -> None:
    statements: list[str] = []

    class CountingCursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            statements.append(str(query))
            return super().execute(query, *args, **kwargs)

    def counting() -> psycopg.Connection[Any]:
        return psycopg.connect(dsn, autocommit=True, cursor_factory=CountingCursor)

    samples = scrape(database_registry(counting))
    assert value(samples, "treadle_database_up") == 1
    assert len(statements) == 1


def test_a_reader_role_may_scrape(dsn: str, conn: psycopg.Connection[Any], known_jobs: None) -> None:
    role = f"metrics_reader_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{role}"')
    try:
        conn.execute("SELECT treadle.grant_reader(%s)", (role,))
        samples = scrape(database_registry(connector(dsn, role)))
        assert value(samples, "treadle_database_up") == 1
        assert value(samples, "treadle_jobs", queue="mail", state="available") == 2
        assert value(samples, "treadle_expired_leases") == 1
    finally:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def test_a_database_it_cannot_reach_gives_up_zero(dsn: str) -> None:
    missing = dsn.rsplit("/", 1)[0] + f"/treadle_missing_{uuid.uuid4().hex[:8]}"
    samples = scrape(database_registry(connector(missing)))
    assert value(samples, "treadle_database_up") == 0
    assert named(samples, "treadle_jobs") == {}


def test_large_tables_estimate_finished_states(dsn: str, conn: psycopg.Connection[Any]) -> None:
    # 2,000 completed jobs and 3 waiting, with statistics: above exact_up_to, the
    # finished count is the planner's estimate, the waiting one still exact
    conn.execute(
        "SELECT count(*) FROM treadle.enqueue_many("
        "(SELECT jsonb_agg(jsonb_build_object('name', 'send', 'queue', 'bulk')) FROM generate_series(1, 2000)))"
    )
    while claimed := claim(conn, "w-bulk", "bulk", batch=500):
        conn.execute(
            "SELECT treadle.complete_many(%s, %s)", ([job for job, _ in claimed], [token for _, token in claimed])
        )
    for _ in range(3):
        conn.execute("SELECT treadle.enqueue('send', queue => 'bulk')")
    conn.execute("ANALYZE treadle.jobs")
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(connector(dsn), exact_up_to=100))
    samples = scrape(registry)
    assert value(samples, "treadle_jobs", queue="bulk", state="available") == 3
    completed = value(samples, "treadle_jobs", queue="bulk", state="completed")
    assert completed is not None and 1000 <= completed <= 4000, completed
