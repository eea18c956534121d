"""Running the `treadle` command as a user does: a subprocess, or one on a terminal (a pty).

Jobs are set up with the extension's SQL on the test's connection, so these tests
depend on the command alone.
"""

from __future__ import annotations

import codecs
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

TREADLE = Path(sys.executable).with_name("treadle")  # the console script pip installed
PATIENCE = 60.0
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a bound on waiting, so a broken behaviour fails instead of hanging


@dataclass
class Done:
    args: tuple[str, ...]
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def __str__(self) -> str:
        return f"treadle {' '.join(self.args)} exited {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def treadle(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Done:
    """Run `treadle ARGS` to its end, stdin a pipe (not a terminal), DATABASE_URL unset unless given."""
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        [str(TREADLE), *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        env={**environment, **(env or {})},
        check=False,
    )
    return Done(args, done.returncode, done.stdout, done.stderr)


def expect(done: Done, code: int, *, err: str | None = None) -> Done:
    """Check the exit code, and that stderr says `err`; never a traceback."""
    assert done.code == code, str(done)
    assert "Traceback" not in done.err, str(done)
    if err is not None:
        assert err in done.err, str(done)
    return done


class Terminal:
    """`treadle ARGS` on a pseudo-terminal: what a person at a terminal sees and types."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        environment = {**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, **(env or {})}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its stdin, stdout and stderr
            os.execve(str(TREADLE), [str(TREADLE), *args], {**environment, "COLUMNS": "120", "TERM": "xterm"})
        self.seen = ""
        # a read can end inside a character (a box-drawing one is 3 bytes): decode across reads
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read_until(self, found: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + PATIENCE
        while not found(self.seen):
            if time.monotonic() > deadline:
                raise AssertionError(f"the terminal never showed {what}:\n{self.seen[-3000:]}")
            if not self._read(0.2):
                break
        return self.seen

    def _read(self, timeout: float) -> bool:
        """Add what the terminal shows within `timeout`; False once the child closed it."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                self.seen += self._decoder.decode(os.read(self.fd, 65536))
            except OSError:
                return False
        return True

    @property
    def text(self) -> str:
        """What the terminal shows, without its escape sequences (colours, cursor moves)."""
        return ANSI.sub("", self.seen)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def interrupt(self) -> None:
        os.kill(self.pid, signal.SIGINT)

    def exit_code(self) -> int:
        deadline = time.monotonic() + PATIENCE
        while True:
            self._read(0.05)  # drain, so the child never blocks on a full pty
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._read(0)
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                raise AssertionError(f"treadle {' '.join(self.args)} did not stop:\n{self.seen[-3000:]}")


def fail_jobs(conn: psycopg.Connection[Any], queue: str, count: int, error: str, *, discard: bool) -> list[int]:
    """Claim `count` jobs of `queue` and fail them with `error`: discarded, or retryable (due now)."""
    if discard:
        conn.execute("UPDATE treadle.jobs SET max_attempts = 1 WHERE queue = %s AND state = 'available'", [queue])
    claimed = conn.execute(
        "SELECT id, lease_token FROM treadle.claim('test-worker', queues => array[%s], batch => %s)", [queue, count]
    ).fetchall()
    for job_id, token in claimed:
        conn.execute(
            "SELECT treadle.fail(%s, %s, %s, retry_in => interval '0 s')",
            [job_id, token, error.replace("{id}", str(job_id))],
        )
    return [job_id for job_id, _ in claimed]


def enqueue(conn: psycopg.Connection[Any], name: str, queue: str = "default", count: int = 1) -> list[int]:
    rows = conn.execute(
        "SELECT treadle.enqueue(%s, '{}', queue => %s) FROM generate_series(1, %s)", [name, queue, count]
    ).fetchall()
    return [row[0] for row in rows]


def states(conn: psycopg.Connection[Any], ids: list[int]) -> list[str]:
    rows = conn.execute("SELECT state FROM treadle.jobs WHERE id = ANY(%s) ORDER BY id", [ids]).fetchall()
    return [row[0] for row in rows]
