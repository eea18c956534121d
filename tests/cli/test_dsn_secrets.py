"""A connection string's password never appears in what the command, the worker or the dashboard print.

libpq quotes a URI it cannot decode: a password with a stray `%` came back whole in
every CLI error and in each of the pools' retries. Now the string is read once and
refused at once (exit 2), the password cut out.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cli.support import TREADLE, treadle
from treadle._pool import WorkerPool

pytestmark = pytest.mark.subprocess

SECRET = "pa%zz-s3cret"
UNREADABLE = f"postgresql://app:{SECRET}@127.0.0.1:1/app"

WORKER_MODULE = """
import os
from treadle import Worker

worker = Worker(os.environ["DATABASE_URL"])
worker.register("noop", lambda args, ctx: None)
"""


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["jobs", "list"],
        ["queues", "list"],
        ["schedules", "list"],
        ["install"],
        ["upgrade"],
        ["--version"],
    ],
)
@pytest.mark.parametrize("given", ["--dsn", "--dsn=", "env"])
def test_an_unreadable_dsn_is_refused_without_its_password(command: list[str], given: str) -> None:
    if given == "env":
        done = treadle(*command, env={"DATABASE_URL": UNREADABLE})
    elif given == "--dsn=":
        done = treadle(*command, f"--dsn={UNREADABLE}")
    else:
        done = treadle(*command, "--dsn", UNREADABLE)
    assert done.code == 2, done
    assert "cannot be read" in done.err, done
    assert "invalid percent-encoded token" in done.err, done
    assert SECRET not in done.err + done.out, done
    assert "zz-s3cret" not in done.err + done.out, done


def test_a_refused_connection_names_no_password() -> None:
    done = treadle("status", "--dsn", "postgresql://app:s3cret-pw@127.0.0.1:1/app")
    assert done.code == 1, done
    assert "cannot connect" in done.err
    assert "s3cret-pw" not in done.err + done.out


def run_to_exit(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 30.0) -> tuple[int, str]:
    started = time.monotonic()
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False, stdin=subprocess.DEVNULL
    )
    assert time.monotonic() - started < timeout
    return done.returncode, done.stdout + done.stderr


def test_a_worker_with_an_unreadable_dsn_stops_at_once_without_its_password(tmp_path: Path) -> None:
    (tmp_path / "jobs_module.py").write_text(WORKER_MODULE)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    # built by the module from $DATABASE_URL
    code, output = run_to_exit([str(TREADLE), "worker", "jobs_module"], {**env, "DATABASE_URL": UNREADABLE}, tmp_path)
    assert code == 2, output
    assert "cannot be read" in output and SECRET not in output and "zz-s3cret" not in output, output
    # the same string built into the Worker in Python
    script = f"from treadle import Worker\nWorker({UNREADABLE!r})\n"
    code, output = run_to_exit([sys.executable, "-c", script], env, tmp_path)
    assert code == 1 and "InvalidArgument" in output, output
    assert "cannot be read" in output and SECRET not in output and "zz-s3cret" not in output, output


def test_the_dashboard_refuses_an_unreadable_dsn_without_its_password(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    code, output = run_to_exit([str(TREADLE), "dashboard", "--dsn", UNREADABLE, "--port", "0"], env, tmp_path)
    assert code != 0, output
    assert "cannot be read" in output and SECRET not in output and "zz-s3cret" not in output, output


def test_the_worker_pool_logs_no_password(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cr%et-w0rd"
    with_password = psycopg.conninfo.make_conninfo(dsn, password=secret)
    pool = WorkerPool(with_password, "treadle-test", 2)
    pool.open()
    try:
        with caplog.at_level(logging.INFO):
            # what psycopg_pool logs on a failed try, and the worker's own lines, carry libpq's message
            logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "pool", f"bad password {secret}")
            logging.getLogger("treadle.worker").warning("claim failed (%s)", f"x {secret} y")
        assert pool.value("SELECT 1") == 1  # the password the pool was given still connects
    finally:
        pool.close()
    text = caplog.text
    assert secret not in text, text
    assert "bad password ***" in text and "x *** y" in text
    # closed: the filter is gone with the pool
    with caplog.at_level(logging.INFO):
        logging.getLogger("psycopg.pool").warning("after %s", "close")
    assert "after close" in caplog.text


def test_every_connection_string_is_read_once_in_python(dsn: str) -> None:
    from treadle import InvalidArgument, Worker
    from treadle.dashboard import create_app

    for make in (
        lambda: Worker(UNREADABLE),
        lambda: Worker(dsn, listen_dsn=UNREADABLE),
        lambda: create_app(UNREADABLE),
    ):
        with pytest.raises(InvalidArgument) as refused:
            make()
        assert "cannot be read: invalid percent-encoded token" in str(refused.value)
        assert SECRET not in str(refused.value) and "zz-s3cret" not in str(refused.value)


LEAKY_MODULE = """
import os
from treadle import Worker

worker = Worker(os.environ["DATABASE_URL"], poll_interval=0.1)


@worker.register("leak")
def leak(args, ctx):
    raise ConnectionError("could not reach " + os.environ["DATABASE_URL"])
"""


def test_a_worker_process_logs_no_password(dsn: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    secret = "s3cr%et-w0rd"
    with_password = psycopg.conninfo.make_conninfo(dsn, password=secret)
    (tmp_path / "leaky.py").write_text(LEAKY_MODULE)
    job_id = conn.execute("SELECT treadle.enqueue('leak', max_attempts => 1)").fetchone()
    assert job_id is not None
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(TREADLE), "worker", "leaky"],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "DATABASE_URL": with_password},
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while conn.execute("SELECT state FROM treadle.jobs WHERE id = %s", job_id).fetchone() != ("discarded",):
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while "job failed" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(timeout=30)
    logged = log_path.read_text()
    assert "could not reach" in logged and "***" in logged, logged
    assert secret not in logged, logged
