"""Fixtures for the worker tests; helpers live in worker_support.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.markers import marks_users
from tests.worker.worker_support import EFFECTS_TABLE, HEARTBEAT, LEASE, POLL, RESCUE, Child
from treadle import Worker


@pytest.fixture
def make_worker(dsn: str) -> Iterator[Callable[..., Worker]]:
    """Build a Worker on the test's database with short test settings; stopped after the test."""
    made: list[Worker] = []

    def make(**options: Any) -> Worker:
        settings: dict[str, Any] = {
            "poll_interval": POLL,
            "lease": LEASE,
            "heartbeat_interval": HEARTBEAT,
            "rescue_interval": RESCUE,
            "stop_timeout": 2.0,
            "concurrency": 4,
        }
        settings.update(options)
        worker = Worker(settings.pop("dsn", dsn), **settings)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.stop(immediate=True)


@pytest.fixture
def effects_conn(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's connection, with the table `effects` that child workers write to."""
    conn.execute(EFFECTS_TABLE)
    return conn


@pytest.fixture
@marks_users(pytest.mark.subprocess)
def spawn(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """Start child worker processes (child_worker.py); any still alive are killed after the test."""
    children: list[Child] = []

    def start(worker_id: str, kill_at: str = "none", **settings: Any) -> Child:
        child = Child(dsn, worker_id, kill_at, tmp_path, **settings)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()


THREAD_PATIENCE = 10.0  # seconds a thread a test started has to end once the test's fixtures stopped it


@pytest.fixture(autouse=True)
def threads_end_with_the_test() -> Iterator[None]:
    """Every thread a test starts (a worker's, its handlers', a helper's) ends with the test.

    One left running logs into the output of the tests after it, or after pytest closed the
    streams it captured with. The test's own fixtures stop what they started (make_worker
    stops its workers); this runs after them, waits THREAD_PATIENCE seconds at most for
    each thread to end, and fails the test for those still running.
    """
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREAD_PATIENCE
    started = [thread for thread in threading.enumerate() if thread not in before]
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [thread.name for thread in started if thread.is_alive()]
    assert not left, f"threads the test started still run after it: {left}"
