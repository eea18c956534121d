"""A real `treadle worker` process for the metrics and log tests, with its standard error kept."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

TREADLE = Path(sys.executable).parent / "treadle"  # the console script pip installed
PATIENCE = 60.0  # a bound so a broken behaviour fails instead of hanging, never a claim about speed

# Jobs: `send` succeeds; `boom` raises ValueError("no such mailbox").
TASKS = """
import os
from treadle.worker import Worker

worker = Worker(os.environ["DATABASE_URL"], ["mail"], concurrency=2, poll_interval=0.1, lease=5,
                heartbeat_interval=1, backoff=lambda attempt: 0)


@worker.register("send")
def send(args, ctx):
    return "sent"


@worker.register("boom")
def boom(args, ctx):
    raise ValueError("no such mailbox")
"""

SERVING = re.compile(r"serving metrics at http://\S+?:(\d+)/metrics")


class WorkerProcess:
    def __init__(self, process: subprocess.Popen[str], stderr: Path) -> None:
        self.process = process
        self.stderr_path = stderr

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_for_log(self, pattern: str | re.Pattern[str]) -> re.Match[str]:
        deadline = time.monotonic() + PATIENCE
        while not (found := re.search(pattern, self.stderr)):
            assert self.process.poll() is None, f"the worker exited early:\n{self.stderr}"
            assert time.monotonic() < deadline, f"no log line matching {pattern!r}:\n{self.stderr}"
            time.sleep(0.05)
        return found

    def metrics_port(self) -> int:
        return int(self.wait_for_log(SERVING).group(1))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=PATIENCE)


@contextmanager
def worker_process(dsn: str, tmp_path: Path, *options: str) -> Iterator[WorkerProcess]:
    """`treadle worker tasks.py OPTIONS...` on the test's database; stopped afterwards."""
    tasks = tmp_path / "tasks.py"
    tasks.write_text(TASKS)
    stderr = tmp_path / "worker.stderr"
    with stderr.open("w") as sink:
        process = subprocess.Popen(
            [str(TREADLE), "worker", str(tasks), "--dsn", dsn, *options],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            text=True,
            cwd=tmp_path,
        )
    running = WorkerProcess(process, stderr)
    try:
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=PATIENCE)


def one_row(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    found = conn.execute(query, params).fetchone()
    assert found is not None, query
    return tuple(found)


def wait_for_jobs(conn: psycopg.Connection[Any], state: str, count: int) -> None:
    deadline = time.monotonic() + PATIENCE
    while conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = %s", (state,)).fetchone() != (count,):
        assert time.monotonic() < deadline, f"timed out waiting for {count} {state} jobs"
        time.sleep(0.05)
