"""Helpers for the worker tests (the fixtures using them are in conftest.py).

Jobs are enqueued with the extension's SQL, never through the Python client, so
these tests depend on the worker alone. Child worker processes run
child_worker.py; they record what their handlers did in the table `effects`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

HERE = Path(__file__).resolve().parent
CHILD = HERE / "child_worker.py"

# How long a test waits for something that should happen soon. Only a bound, so a
# broken behaviour fails instead of hanging; never a claim about speed.
PATIENCE = 60.0

# Short settings for workers under test (seconds).
LEASE = 1.0
HEARTBEAT = 0.2
RESCUE = 0.2
POLL = 0.2

T = TypeVar("T")


def wait_for(check: Callable[[], T | Literal[False] | None], what: str, timeout: float = PATIENCE) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def enqueue(conn: psycopg.Connection[Any], name: str, args: Any = None, **options: Any) -> int:
    """treadle.enqueue in SQL; options are its named arguments (every as a timedelta or interval text)."""
    names = ["name => %(name)s", "args => %(args)s"] + [f"{key} => %({key})s" for key in options]
    row = conn.execute(
        f"SELECT treadle.enqueue({', '.join(names)})",
        {"name": name, "args": Jsonb(args if args is not None else {}), **options},
    ).fetchone()
    assert row is not None
    return int(row[0])


def start_workflow(conn: psycopg.Connection[Any], name: str, input: Any, steps: list[str] | None = None) -> int:
    row = conn.execute("SELECT treadle.start_workflow(%s, %s, %s)", [name, Jsonb(input), steps]).fetchone()
    assert row is not None
    return int(row[0])


def job(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None, f"no job {job_id}"
    return row


def run(conn: psycopg.Connection[Any], run_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None, f"no run {run_id}"
    return row


def job_state(conn: psycopg.Connection[Any], job_id: int) -> str:
    return str(job(conn, job_id)["state"])


def until_state(conn: psycopg.Connection[Any], job_id: int, *states: str) -> dict[str, Any]:
    """The job's row once it is in one of `states`."""
    return wait_for(
        lambda: (row := job(conn, job_id))["state"] in states and row, f"job {job_id} to reach {' or '.join(states)}"
    )


def until_run_finished(conn: psycopg.Connection[Any], run_id: int) -> dict[str, Any]:
    return wait_for(lambda: (row := run(conn, run_id))["state"] != "running" and row, f"run {run_id} to finish")


def run_steps(conn: psycopg.Connection[Any], run_id: int) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id", [run_id]).fetchall()


# side effects recorded by child workers
EFFECTS_TABLE = """
CREATE TABLE effects (
    id      bigserial PRIMARY KEY,
    job_id  bigint,
    step    text,
    attempt integer,
    worker  text,
    what    text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def effects(conn: psycopg.Connection[Any], what: str | None = None, **where: Any) -> list[dict[str, Any]]:
    """Rows of `effects`, oldest first, filtered by `what` and column values."""
    clauses = ["true"] + (["what = %(what)s"] if what else []) + [f"{key} = %({key})s" for key in where]
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            f"SELECT * FROM effects WHERE {' AND '.join(clauses)} ORDER BY id", {"what": what, **where}
        ).fetchall()


class Child:
    """A worker process running child_worker.py (or `script`); its output goes to a log file."""

    def __init__(
        self, dsn: str, worker_id: str, kill_at: str, log_dir: Path, script: Path = CHILD, **settings: Any
    ) -> None:
        self.worker_id = worker_id
        self.log_path = log_dir / f"{worker_id}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        settings = {"lease": LEASE, "heartbeat": HEARTBEAT, "rescue": RESCUE, "poll": POLL, **settings}
        env.update({f"CHILD_{key.upper()}": str(value) for key, value in settings.items()})
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), dsn, worker_id, kill_at], stdout=log, stderr=subprocess.STDOUT, env=env
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_exit(self, timeout: float = PATIENCE) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.worker_id} did not exit; its log:\n{self.log()}") from None

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stopped(self) -> bool:
        """True while the process is stopped by SIGSTOP."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0] == "T"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process must run to die
            self.process.kill()
            self.process.wait(10)


def until_registered(conn: psycopg.Connection[Any], worker_id: str) -> dict[str, Any]:
    """The worker's row in treadle.workers once it has started."""

    def row() -> dict[str, Any] | None:
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute("SELECT * FROM treadle.workers WHERE id = %s", [worker_id]).fetchone()

    return wait_for(row, f"worker {worker_id} to start")
