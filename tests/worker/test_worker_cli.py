"""The `treadle` command: worker, enqueue, status, and the hand-over to the dashboard."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import EXTENSION_VERSION
from tests.worker.worker_support import PATIENCE, enqueue, job, until_state
from treadle import Worker
from treadle.cli import CommandError, load_worker, main

TREADLE = Path(sys.executable).parent / "treadle"  # the console script pip installed
# status of an empty database: no rows, then what is installed and who owns it
NO_JOBS = f"no jobs\ntreadle {EXTENSION_VERSION} (extension), owned by role postgres\n"

APP = """
import os
from treadle import Worker

worker = Worker(os.environ["DATABASE_URL"], poll_interval=0.2, lease=2, heartbeat_interval=0.5)
worker.register("greet", lambda args, ctx: f"hello {args['who']}")


def make(dsn):
    built = Worker(dsn)
    built.register("greet", lambda args, ctx: "made")
    return built


not_a_worker = 42
"""


@pytest.fixture
def app(tmp_path: Path) -> Path:
    path = tmp_path / "jobs_app.py"
    path.write_text(textwrap.dedent(APP))
    return path


def test_status_prints_an_aligned_table(
    dsn: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(12):
        enqueue(conn, "send", queue="mail")
    enqueue(conn, "report", queue="reports-weekly")
    conn.execute("SELECT treadle.cancel(id) FROM treadle.jobs WHERE name = 'report'")
    assert main(["status", "--dsn", dsn]) == 0
    *lines, installed = capsys.readouterr().out.splitlines()
    assert installed == f"treadle {EXTENSION_VERSION} (extension), owned by role postgres"
    assert lines[0].split() == ["QUEUE", "STATE", "JOBS", "OLDEST", "WAITING"]
    assert lines[1].split()[:3] == ["mail", "available", "12"]
    assert lines[1].split()[4] == "s"
    assert lines[2].split() == ["reports-weekly", "cancelled", "1", "-"]
    assert len({line.index(line.split()[1]) for line in lines}) == 1, "the STATE column is aligned"


def test_status_of_an_empty_queue(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--dsn", dsn]) == 0
    assert capsys.readouterr().out == NO_JOBS


def test_the_database_comes_from_dsn_or_database_url(
    dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["status"]) == 1
    assert capsys.readouterr().err == "treadle: error: no database: pass --dsn or set DATABASE_URL\n"
    monkeypatch.setenv("DATABASE_URL", dsn)
    assert main(["status"]) == 0
    assert capsys.readouterr().out == NO_JOBS


def test_enqueue_prints_the_new_jobs_id(
    dsn: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "enqueue",
                "send",
                '{"to": "ada@example.org"}',
                "--queue",
                "mail",
                "--priority",
                "-1",
                "--max-attempts",
                "3",
                "--dsn",
                dsn,
            ]
        )
        == 0
    )
    row = job(conn, int(capsys.readouterr().out))
    assert (row["name"], row["args"], row["queue"], row["priority"], row["max_attempts"]) == (
        "send",
        {"to": "ada@example.org"},
        "mail",
        -1,
        3,
    )
    assert main(["enqueue", "tick", "--dsn", dsn]) == 0
    assert job(conn, int(capsys.readouterr().out))["args"] == {}


@pytest.mark.parametrize(
    "payload, message",
    [
        ("{to: 1}", "treadle: error: JSON is not valid JSON: Expecting property name"),
        ("5", "treadle: error: args must be a JSON object or array, not number"),
    ],
)
def test_enqueue_refuses_bad_json_and_writes_nothing(
    dsn: str, conn: psycopg.Connection[Any], payload: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["enqueue", "send", payload, "--dsn", dsn]) == 2  # usage: a bad value, nothing written
    error = capsys.readouterr().err
    assert error.startswith("treadle: error:") and message in error
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


@pytest.mark.subprocess
def test_treadle_worker_runs_a_modules_worker_until_sigterm(dsn: str, conn: psycopg.Connection[Any], app: Path) -> None:
    job_id = enqueue(conn, "greet", {"who": "you"})
    with open(app.parent / "worker.log", "wb") as log:
        process = subprocess.Popen(
            [TREADLE, "worker", "jobs_app", "--dsn", dsn], cwd=app.parent, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        assert until_state(conn, job_id, "completed")["result"] == "hello you"
        process.send_signal(signal.SIGTERM)
        assert process.wait(PATIENCE) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "stopping (signal SIGTERM)" in (app.parent / "worker.log").read_text()


def test_a_worker_is_found_by_module_path_file_path_or_factory(
    dsn: str, app: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.chdir(app.parent)
    monkeypatch.delitem(sys.modules, "jobs_app", raising=False)
    assert isinstance(load_worker("jobs_app", dsn), Worker)
    made = load_worker(f"{app}:make", dsn)
    assert isinstance(made, Worker) and made.poll_interval == 1.0


@pytest.mark.parametrize(
    "target, message",
    [
        ("no_such_module_here", "cannot import 'no_such_module_here': ModuleNotFoundError"),
        ("jobs_app:missing", "module 'jobs_app' has no attribute 'missing'"),
        ("jobs_app:not_a_worker", "jobs_app:not_a_worker is not a treadle Worker but a value of type int"),
        (":worker", "names no module"),
        ("/no/such/file.py", "no such file: /no/such/file.py"),
    ],
)
def test_a_target_that_is_not_a_worker_is_refused(
    dsn: str, app: Path, target: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.chdir(app.parent)
    with pytest.raises(CommandError, match=message):
        load_worker(target, dsn)


@pytest.fixture
def cli_logging_undone() -> Iterator[None]:
    """`treadle worker` run in-process configures the root logger, as a program's entry point does
    (a handler on this test's captured stderr, closed when the test ends): put it back as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers and not type(handler).__module__.startswith("_pytest"):
            root.addHandler(handler)  # (pytest's own it adds again itself, phase by phase)
    root.setLevel(level)


def test_treadle_worker_reports_a_bad_target(capsys: pytest.CaptureFixture[str], cli_logging_undone: None) -> None:
    assert main(["worker", "no_such_module_here"]) == 1
    assert "treadle: error: cannot import 'no_such_module_here'" in capsys.readouterr().err


def test_dashboard_options_go_to_the_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--dsn", "postgresql://unused", "--port", "70000"]) == 2
    assert "--port must be between 0 and 65535, got 70000" in capsys.readouterr().err


@pytest.mark.subprocess
def test_the_console_script_is_installed(dsn: str) -> None:
    done = subprocess.run([TREADLE, "status", "--dsn", dsn], capture_output=True, text=True, timeout=PATIENCE)
    assert (done.returncode, done.stdout) == (0, NO_JOBS)
    usage = subprocess.run([TREADLE], capture_output=True, text=True, timeout=PATIENCE)
    assert usage.returncode == 2 and "usage: treadle" in usage.stderr
