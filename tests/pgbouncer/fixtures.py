"""A real PgBouncer in transaction mode, in front of the test server, for tests that go through a pooler.

`pgbouncer_url` (session) starts Debian's pgbouncer (scripts/install-test-deps
installs it) with pool_mode = transaction, forwarding every database name to
the test server, and yields a URL to it (database `postgres`); `bouncer_dsn`
names the test's own database through it. A test directory uses them by
importing them into its conftest.py (tests/ is on pytest's path), as
tests/pgbouncer/conftest.py does:

    from tests.pgbouncer.fixtures import bouncer_dsn, pgbouncer_url  # noqa: F401
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.markers import marks_users

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
START_PATIENCE = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _with_db(url: str, dbname: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + dbname


@pytest.fixture(scope="session")
@marks_users(pytest.mark.subprocess)
def pgbouncer_url(pg_server: str) -> Iterator[str]:
    if not os.path.exists(PGBOUNCER):
        pytest.fail("pgbouncer is not installed: run scripts/install-test-deps (Debian's pgbouncer package)")
    server = psycopg.conninfo.conninfo_to_dict(pg_server)
    folder = Path(tempfile.mkdtemp(prefix="treadle-pgbouncer-"))
    port = _free_port()
    (folder / "users.txt").write_text(f'"{server.get("user", "postgres")}" ""\n')
    (folder / "pgbouncer.ini").write_text(f"""
[databases]
* = host={server.get("host", "127.0.0.1")} port={server.get("port", 5432)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / "users.txt"}
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
max_db_connections = 40
logfile = {folder / "pgbouncer.log"}
pidfile = {folder / "pgbouncer.pid"}
""")
    command = [PGBOUNCER, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        shutil.chown(folder, "postgres")
        for path in folder.iterdir():
            shutil.chown(path, "postgres")
        command[1:1] = ["-u", "postgres"]
    url = f"postgresql://{server.get('user', 'postgres')}@127.0.0.1:{port}/postgres"
    # it logs to its logfile; what it says before that goes to the log too
    with (
        (folder / "pgbouncer.stderr").open("wb") as stderr,
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr) as process,
    ):
        try:
            _until_it_answers(url, process, folder)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _until_it_answers(url: str, process: subprocess.Popen[bytes], folder: Path) -> None:
    deadline = time.monotonic() + START_PATIENCE
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            log = folder / "pgbouncer.log"
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start: {log.read_text() if log.exists() else ''}") from None
            time.sleep(0.1)


@pytest.fixture
def bouncer_dsn(pgbouncer_url: str, dsn: str) -> str:
    """The test's own database (the `dsn` fixture's), reached through PgBouncer in transaction mode."""
    return _with_db(pgbouncer_url, str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]))
