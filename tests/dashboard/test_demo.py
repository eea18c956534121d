"""`make demo` for real: scripts/demo with a cluster of its own, run twice, each run
stopping by itself (TREADLE_DEMO_SECONDS); the dashboard answers and jobs get done."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 10


def run_demo(cluster: Path) -> tuple[str, str, str]:
    """Run the demo until it stops by itself; return the dashboard URL and database URL
    it printed, and what it said on stderr."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "TREADLE_DEMO_SECONDS": str(SECONDS),
        "TREADLE_DEMO_CLUSTER": str(cluster),
        "TREADLE_DEMO_PYTHON": sys.executable,
        "PORT": "0",
    }
    with subprocess.Popen(
        [str(ROOT / "scripts" / "demo")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:  # closes both pipes
        try:
            assert process.stdout is not None
            lines = [process.stdout.readline() for _ in range(3)]
            assert lines[0] == "treadle demo\n", (lines, process.stderr.read() if process.stderr else "")
            dashboard = lines[1].split("dashboard: ", 1)[1].strip()
            database = lines[2].split("database: ", 1)[1].strip()

            with urllib.request.urlopen(dashboard, timeout=30) as response:
                assert response.status == 200 and b'<section id="states"' in response.read()
            done = 0
            with psycopg.connect(database, autocommit=True) as conn:
                deadline = time.monotonic() + SECONDS
                while done == 0 and time.monotonic() < deadline:
                    row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'completed'").fetchone()
                    done = row[0] if row else 0
                    time.sleep(0.5)
                kinds = {name for (name,) in conn.execute("SELECT DISTINCT name FROM treadle.jobs").fetchall()}
            assert done > 0, "the demo's worker completed no job"
            assert {"send_email", "sync_crm", "charge_card", "nightly_report", "workflow:order/reserve"} <= kinds

            assert process.wait(timeout=SECONDS + 60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        said = process.stderr.read() if process.stderr else ""
    return dashboard, database, said


@pytest.fixture
def cluster() -> Iterator[Path]:
    """A folder for the demo's cluster. Not under pytest's tmp_path: the server runs as
    the postgres user, and pytest keeps its own folders closed to other users."""
    folder = Path(tempfile.mkdtemp(prefix="treadle-demo-"))
    yield folder / "demo-cluster"
    subprocess.run([str(ROOT / "scripts" / "pgcluster"), "stop", str(folder / "demo-cluster")], check=False)
    shutil.rmtree(folder, ignore_errors=True)


def test_the_demo_runs_twice_and_stops_what_it_started(cluster: Path) -> None:
    _, first, said = run_demo(cluster)
    assert not (cluster / "data" / "postmaster.pid").exists(), said
    assert f"demo: stopped the cluster in {cluster}" in said
    _, second, said = run_demo(cluster)  # the same cluster folder, started again, a fresh database
    assert second.rsplit("/", 1)[1] == first.rsplit("/", 1)[1] == "treadle_demo"
    assert not (cluster / "data" / "postmaster.pid").exists(), said


def unprivileged(command: list[str]) -> list[str]:
    """The command as a user who cannot write to folders it does not own."""
    return ["runuser", "-u", "nobody", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder other users may read (pytest's own are closed to them)."""
    folder = Path(tempfile.mkdtemp(prefix="treadle-demo-"))
    folder.chmod(0o755)
    yield folder
    for child in folder.rglob("*"):
        child.chmod(0o755)
    shutil.rmtree(folder, ignore_errors=True)


def test_the_demo_says_what_to_do_when_it_cannot_install(open_folder: Path) -> None:
    share = open_folder / "share"
    (share / "extension").mkdir(parents=True)
    (share / "extension").chmod(0o555)  # a server whose extension folder this user cannot write to
    pg_config = open_folder / "pg_config"
    pg_config.write_text(f'#!/bin/sh\n[ "$1" = --sharedir ] && echo {share}\n')
    pg_config.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"PG_CONFIG": str(pg_config)}
    ran = subprocess.run(
        unprivileged([str(ROOT / "scripts" / "demo")]), capture_output=True, text=True, env=env, timeout=60
    )
    assert ran.returncode == 1 and ran.stdout == ""
    assert f"must be installed into {share}/extension, which you cannot write to" in ran.stderr
    assert "sudo make install PG_CONFIG=" in ran.stderr


def test_the_demo_says_what_to_do_without_postgresql() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"PG_CONFIG": "/nonexistent/pg_config"}
    ran = subprocess.run([str(ROOT / "scripts" / "demo")], capture_output=True, text=True, env=env, timeout=60)
    assert ran.returncode == 1
    assert "/nonexistent/pg_config not found. Install PostgreSQL's server" in ran.stderr
