"""treadle through PgBouncer in transaction mode, every option at its default.

A worker process drains jobs and runs a workflow through the pooler; wait,
wait_workflow and watch read through it. Behind a transaction-mode pooler no
session state survives between transactions: prepared statements are off by
default there (a worker prepares only on a connection whose backend process id is the
server's own, which a pooler's is not), and LISTEN (whose notifications never come back through the pooler,
and which would stay on a server connection other clients get) is not sent
through it: the waits poll, or LISTEN on `listen_dsn`, a direct connection.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import treadle
from treadle._pool import PREPARE_THRESHOLD, WorkerPool, is_direct

WORKER = Path(__file__).resolve().parent / "bouncer_worker.py"
PATIENCE = 120.0  # a bound so that a broken behaviour fails, never a claim about speed
JOBS = 500


class WorkerProcess:
    def __init__(self, dsn: str, log: Path) -> None:
        self.log_path = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, str(WORKER), dsn], stdout=out, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(PATIENCE)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[[str], WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(dsn: str) -> WorkerProcess:
        worker = WorkerProcess(dsn, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(10)


@pytest.fixture
def producer(bouncer_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """The application's connection through the pooler (its own statements are not prepared either)."""
    with psycopg.connect(bouncer_dsn, autocommit=True, prepare_threshold=None) as conn:
        yield conn


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + PATIENCE
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(conn.execute("SELECT state, count(*) FROM treadle.jobs GROUP BY state").fetchall())


def listening_backends(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%' AND datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_with_default_options_drains_jobs_through_pgbouncer(
    producer: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
    bouncer_dsn: str,
    start_worker: Callable[[str], WorkerProcess],
) -> None:
    with producer.transaction():
        ids = treadle.enqueue_many(producer, [{"name": "echo", "args": {"n": n}} for n in range(JOBS - 20)])
        ids += [treadle.enqueue(producer, "echo", {"n": n}) for n in range(JOBS - 20, JOBS)]
    worker = start_worker(bouncer_dsn)
    wait_for(lambda: counts(conn).get("completed") == JOBS, f"{JOBS} jobs completed; log:\n{worker.log()}")
    results = dict(conn.execute("SELECT id, result FROM treadle.jobs").fetchall())
    assert [results[job_id] for job_id in ids] == [{"n": n} for n in range(JOBS)]
    assert counts(conn) == {"completed": JOBS}
    assert conn.execute("SELECT max(attempt) FROM treadle.jobs").fetchone() == (1,)
    assert listening_backends(conn) == 0  # no LISTEN left on a server connection the pooler shares
    assert worker.process.poll() is None, worker.log()
    assert worker.stop() == 0, worker.log()
    assert "prepared statement" not in worker.log()
    assert conn.execute("SELECT count(*) FROM treadle.workers").fetchone() == (0,)


def test_a_workflow_and_the_waits_through_pgbouncer(
    producer: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
    bouncer_dsn: str,
    start_worker: Callable[[str], WorkerProcess],
) -> None:
    worker = start_worker(bouncer_dsn)
    job_id = treadle.enqueue(producer, "echo", {"hello": "pooler"})
    assert treadle.wait(bouncer_dsn, job_id, timeout=PATIENCE) == {"hello": "pooler"}
    assert treadle.wait(producer, job_id, timeout=PATIENCE) == {"hello": "pooler"}
    assert listening_backends(conn) == 0

    # the workflow's definition is recorded when the worker starts
    wait_for(lambda: conn.execute("SELECT count(*) FROM treadle.workflows").fetchone() == (1,), "pair defined")
    run_id = treadle.start_workflow(producer, "pair", {"order": 7})
    assert treadle.wait_workflow(bouncer_dsn, run_id, timeout=PATIENCE) == {
        "first": {"step": "first", "seen": [], "input": {"order": 7}},
        "second": {"step": "second", "seen": ["first"], "input": {"order": 7}},
    }

    # a direct listen_dsn beside the pooler: the wait is woken by NOTIFY, not by its (hour-long) timer
    later = treadle.enqueue(producer, "echo", {"woken": True})
    assert treadle.wait(bouncer_dsn, later, timeout=PATIENCE, poll_interval=3600, listen_dsn=conn.info.dsn) == {
        "woken": True
    }
    assert worker.stop() == 0, worker.log()


def test_watch_through_pgbouncer_polls_and_listens_on_listen_dsn(
    producer: psycopg.Connection[Any],
    conn: psycopg.Connection[Any],
    bouncer_dsn: str,
    start_worker: Callable[[str], WorkerProcess],
) -> None:
    stop = threading.Event()
    polled = treadle.watch(bouncer_dsn, ["default"], poll_interval=0.1, stop=stop)
    assert [next(polled) for _ in range(3)] == [treadle.WatchEvent("poll", None)] * 3
    assert listening_backends(conn) == 0
    polled.close()

    heard: list[treadle.WatchEvent] = []
    watcher = threading.Thread(
        target=treadle.watch,
        args=(bouncer_dsn, ["default"], heard.append),
        kwargs={"poll_interval": 3600, "stop": stop, "listen_dsn": conn.info.dsn},
    )
    watcher.start()
    try:
        wait_for(lambda: heard, "the first poll")
        worker = start_worker(bouncer_dsn)
        treadle.enqueue(producer, "echo", {})
        wait_for(lambda: treadle.WatchEvent("done", "default") in heard, "a done event through listen_dsn")
        assert treadle.WatchEvent("queued", "default") in heard
        assert worker.stop() == 0, worker.log()
    finally:
        stop.set()
        watcher.join(PATIENCE)


def pooled_session(pool: WorkerPool) -> tuple[int | None, int]:
    """A connection of the worker's pool: its prepare_threshold, and how many statements its
    session holds prepared after one statement ran six times (in six transactions)."""
    with pool.connection() as conn:
        for _ in range(6):
            conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = %s", ["available"])
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
        assert prepared is not None
        return conn.prepare_threshold, int(prepared[0])


@pytest.mark.parametrize("through", ["server", "pgbouncer"])
def test_prepared_statements_by_default_only_where_the_connection_is_direct(
    through: str, dsn: str, bouncer_dsn: str
) -> None:
    target = dsn if through == "server" else bouncer_dsn
    with psycopg.connect(target, autocommit=True, prepare_threshold=None) as conn:
        assert is_direct(conn) is (through == "server")
    pool = WorkerPool(target, "treadle-test", 2)
    pool.open()
    try:
        session = pooled_session(pool)
    finally:
        pool.close()
    if through == "server":
        assert session == (PREPARE_THRESHOLD, 1)  # prepared at its second run: one statement
    else:
        assert session == (None, 0)  # PgBouncer in transaction mode would lose them


@pytest.mark.parametrize("prepared, threshold", [(False, None), (True, PREPARE_THRESHOLD)])
def test_prepared_statements_as_told_whatever_the_connection(prepared: bool, threshold: int | None, dsn: str) -> None:
    pool = WorkerPool(dsn, "treadle-test", 2, prepared_statements=prepared)
    pool.open()
    try:
        with pool.connection() as conn:
            assert conn.prepare_threshold == threshold
    finally:
        pool.close()
