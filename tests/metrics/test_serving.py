"""A real worker process serving --metrics-port, scraped over HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.metrics.scraping import fetch, named, parse, scrape_when, value
from tests.metrics.worker_process import wait_for_jobs, worker_process


def enqueue(conn: psycopg.Connection[Any], name: str, count: int, **options: Any) -> None:
    extra = "".join(f", {key} => %({key})s" for key in options)
    for _ in range(count):
        conn.execute(f"SELECT treadle.enqueue(%(name)s, queue => 'mail'{extra})", {"name": name, **options})


@pytest.mark.subprocess
def test_a_worker_serves_what_it_did(dsn: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    enqueue(conn, "send", 5)
    enqueue(conn, "boom", 1, max_attempts=2)
    with worker_process(dsn, tmp_path, "--metrics-port", "0") as worker:
        port = worker.metrics_port()
        wait_for_jobs(conn, "completed", 5)
        wait_for_jobs(conn, "discarded", 1)
        url = f"http://127.0.0.1:{port}/metrics"
        samples = scrape_when(url, lambda s: sum(named(s, "treadle_worker_jobs_total").values()) == 7)
        content_type = fetch(url)[1]
        assert worker.stop() == 0

    assert content_type.startswith("text/plain; version=")
    assert named(samples, "treadle_worker_jobs_total") == {
        (("name", "send"), ("outcome", "completed"), ("queue", "mail")): 5,
        (("name", "boom"), ("outcome", "failed"), ("queue", "mail")): 1,
        (("name", "boom"), ("outcome", "discarded"), ("queue", "mail")): 1,
    }
    assert value(samples, "treadle_worker_run_seconds_count", queue="mail", name="send") == 5
    assert value(samples, "treadle_worker_claim_to_start_seconds_count", queue="mail", name="boom") == 2
    assert value(samples, "treadle_worker_slots") == 2
    assert value(samples, "treadle_worker_busy_slots") == 0
    assert value(samples, "treadle_worker_rescued_jobs_total") == 0
    # without --metrics-database, the database's metrics are the dashboard's to serve
    assert named(samples, "treadle_jobs") == {}


@pytest.mark.subprocess
def test_with_metrics_database_it_serves_the_databases_too(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    enqueue(conn, "send", 3)
    conn.execute("SELECT treadle.enqueue('send', queue => 'archive')")  # a queue no worker claims from
    with worker_process(dsn, tmp_path, "--metrics-port", "0", "--metrics-database") as worker:
        port = worker.metrics_port()
        wait_for_jobs(conn, "completed", 3)
        samples = scrape_when(
            f"http://127.0.0.1:{port}/metrics",
            lambda s: value(s, "treadle_worker_jobs_total", queue="mail", name="send", outcome="completed") == 3,
        )
        worker.stop()

    assert value(samples, "treadle_database_up") == 1
    assert value(samples, "treadle_jobs", queue="mail", state="completed") == 3
    assert value(samples, "treadle_jobs", queue="archive", state="available") == 1
    assert value(samples, "treadle_live_workers", queue="mail") == 1
    assert value(samples, "treadle_live_workers", queue="archive") == 0
    assert value(samples, "treadle_worker_jobs_total", queue="mail", name="send", outcome="completed") == 3


@pytest.mark.subprocess
def test_a_worker_counts_the_leases_its_rescues_return(dsn: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    # two jobs claimed an hour ago by a worker that died: their leases ran out long since
    for _ in range(2):
        conn.execute("SELECT treadle.enqueue('send', queue => 'mail', run_at => now() - interval '2 hours')")
    conn.execute("SELECT set_config('treadle.now', (now() - interval '1 hour')::text, false)")
    assert len(conn.execute("SELECT * FROM treadle.claim('dead-worker', ARRAY['mail'], batch => 2)").fetchall()) == 2
    conn.execute("RESET treadle.now")
    with worker_process(dsn, tmp_path, "--metrics-port", "0") as worker:
        port = worker.metrics_port()
        wait_for_jobs(conn, "completed", 2)
        samples = parse(fetch(f"http://127.0.0.1:{port}/metrics")[0])
        worker.stop()
    assert value(samples, "treadle_worker_rescued_jobs_total") == 2


@pytest.mark.subprocess
def test_without_prometheus_client_the_worker_says_what_to_install(dsn: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.py"
    tasks.write_text(
        "from treadle.worker import Worker\nworker = Worker('postgresql:///unused')\n"
        "worker.register('send', lambda args, ctx: None)\n"
    )
    script = textwrap.dedent(f"""
        import sys
        sys.modules["prometheus_client"] = None  # as if the extra were not installed
        from treadle.cli import main
        sys.exit(main(["worker", {str(tasks)!r}, "--dsn", {dsn!r}, "--metrics-port", "0"]))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "treadle: error: treadle's metrics need prometheus_client: pip install 'treadle[metrics]'"
    )


@pytest.mark.subprocess
def test_a_port_in_use_is_one_line_and_exit_1(dsn: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with worker_process(dsn, tmp_path, "--metrics-port", str(port), "--metrics-host", "127.0.0.1") as worker:
            assert worker.process.wait(timeout=60) == 1
    assert worker.stderr.strip().splitlines()[-1] == (
        f"treadle: error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )


def listening_addresses(port: int) -> set[str]:
    """The local addresses the machine's TCP sockets listen on at `port` (from /proc/net/tcp and tcp6)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.subprocess
def test_a_worker_serves_its_metrics_on_this_machine_only_unless_told(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with worker_process(dsn, tmp_path, "--metrics-port", "0") as worker:
        port = worker.metrics_port()
        assert f"serving metrics at http://127.0.0.1:{port}/metrics" in worker.stderr
        assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, not 0.0.0.0 (00000000)
        assert fetch(f"http://127.0.0.1:{port}/metrics")[0]
        worker.stop()
    with worker_process(dsn, tmp_path, "--metrics-port", "0", "--metrics-host", "0.0.0.0") as worker:
        port = worker.metrics_port()
        assert listening_addresses(port) == {"00000000"}  # every interface, when asked
        worker.stop()
