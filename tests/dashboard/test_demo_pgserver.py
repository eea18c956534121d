"""`make demo` for a user without root: scripts/demo, run as an unprivileged user from a
checkout of its own, meets a PostgreSQL whose extension folder it cannot write to, then no
PostgreSQL at all, and each time runs PostgreSQL 16 from the pgserver wheel instead
(scripts/pgserver). Each run stops by itself (TREADLE_DEMO_SECONDS): the dashboard answers
and jobs get done."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 10
NOT_COPIED = shutil.ignore_patterns(
    ".build", ".git", "__pycache__", "*.egg-info", ".mypy_cache", ".pytest_cache", ".ruff_cache", "test-artifacts"
)


@dataclass
class Place:
    """A checkout, a home and a PATH for a user who is not root."""

    checkout: Path
    home: Path
    share: Path  # the share folder of the PostgreSQL that pg_config on PATH names
    path: str

    def env(self, **extra: str) -> dict[str, str]:
        # pip's settings and proxies carry over: the user reaches PyPI as this machine does
        carried = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")}
        return carried | {"PATH": self.path, "HOME": str(self.home), "LANG": "C.UTF-8"} | extra

    def command(self, argv: list[str], **extra: str) -> list[str]:
        """argv with this environment only, as `nobody` when the tests run as root."""
        env = ["env", "-i", *(f"{k}={v}" for k, v in self.env(**extra).items())]
        user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        return [*user, *env, *argv]


@pytest.fixture
def place() -> Iterator[Place]:
    """A copy of the checkout and a home owned by the user; a `pg_config` first on PATH whose
    server has no treadle and an extension folder that user cannot write to. Not under
    pytest's tmp_path, which other users cannot reach."""
    folder = Path(tempfile.mkdtemp(prefix="treadle-demo-pg16-"))
    folder.chmod(0o755)
    checkout, home, bin_, share = folder / "checkout", folder / "home", folder / "bin", folder / "share"
    shutil.copytree(ROOT, checkout, symlinks=True, ignore=NOT_COPIED)
    home.mkdir()
    (share / "extension").mkdir(parents=True)
    (share / "extension").chmod(0o555)
    bin_.mkdir()
    (bin_ / "pg_config").write_text(f'#!/bin/sh\n[ "$1" = --sharedir ] && echo {share}\n')
    (bin_ / "pg_config").chmod(0o755)
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "nobody:", str(checkout), str(home)], check=True)
    place = Place(checkout, home, share, f"{bin_}:/usr/local/bin:/usr/bin:/bin")
    yield place

    # stop a cluster a failed run left behind, as the user who runs it
    pgserver = checkout / ".build" / "pgserver"
    cluster = checkout / ".build" / "demo-cluster-pg16"
    if (pgserver / ".pg_config").exists() and (cluster / "data" / "postmaster.pid").exists():
        pg_config = pgserver / (pgserver / ".pg_config").read_text().strip()
        stop = [str(checkout / "scripts" / "pgcluster"), "stop", str(cluster)]
        subprocess.run(place.command(stop, PG_CONFIG=str(pg_config)), check=False)
    for child in folder.rglob("*"):
        if not child.is_symlink():
            child.chmod(0o755)
    shutil.rmtree(folder, ignore_errors=True)


def without_pg_config(place: Place) -> Place:
    """The same place on a machine without PostgreSQL: a PATH of the system's commands
    less pg_config."""
    bare = place.checkout.parent / "bare-bin"
    bare.mkdir()
    for system in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(system).iterdir() if Path(system).is_dir() else ():
            if tool.name != "pg_config" and not os.path.lexists(bare / tool.name):
                (bare / tool.name).symlink_to(tool)
    return replace(place, path=str(bare))


def demo_python(place: Place) -> str:
    """A Python with treadle and the dashboard, installed by the user from its checkout."""
    venv = place.home / "venv"
    setup = f'python3 -m venv "{venv}" && "{venv}/bin/pip" install -q "{place.checkout}[dashboard]"'
    subprocess.run(place.command(["bash", "-ec", setup]), check=True, capture_output=True, timeout=240)
    return str(venv / "bin" / "python")


def run_demo(place: Place, python: str) -> tuple[str, str]:
    """Run the demo as the user until it stops by itself; return its database URL and
    what it said on stderr, having checked the dashboard and the jobs."""
    command = place.command(
        [str(place.checkout / "scripts" / "demo")],
        TREADLE_DEMO_SECONDS=str(SECONDS),
        TREADLE_DEMO_PYTHON=python,
        PORT="0",
    )
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:  # closes both pipes
        try:
            assert process.stdout is not None and process.stderr is not None
            lines = [process.stdout.readline() for _ in range(3)]
            assert lines[0] == "treadle demo\n", (lines, process.stderr.read() if lines[0] == "" else "")
            dashboard = lines[1].split("dashboard: ", 1)[1].strip()
            database = lines[2].split("database: ", 1)[1].strip()

            with urllib.request.urlopen(dashboard, timeout=30) as response:
                assert response.status == 200 and b'<section id="states"' in response.read()
            done = 0
            with psycopg.connect(database, autocommit=True) as conn:
                server_version = conn.execute("show server_version").fetchone()
                deadline = time.monotonic() + SECONDS
                while done == 0 and time.monotonic() < deadline:
                    row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'completed'").fetchone()
                    done = row[0] if row else 0
                    time.sleep(0.5)
                kinds = {name for (name,) in conn.execute("SELECT DISTINCT name FROM treadle.jobs").fetchall()}
            assert server_version is not None and server_version[0].startswith("16."), server_version
            assert done > 0, "the demo's worker completed no job"
            assert {"send_email", "sync_crm", "charge_card", "nightly_report", "workflow:order/reserve"} <= kinds

            assert process.wait(timeout=SECONDS + 60) == 0
            said = process.stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return database, said


def test_the_demo_runs_postgresql_16_from_pgserver_without_root(place: Place) -> None:
    python = demo_python(place)
    cluster = place.checkout / ".build" / "demo-cluster-pg16"

    first, said = run_demo(place, python)
    assert f"treadle is not in {place.share}/extension and you cannot write there" in said
    assert "using PostgreSQL 16 from pgserver" in said
    assert "pgserver: installing pgserver" in said
    assert f"demo: stopped the cluster in {cluster}" in said
    assert not (cluster / "data" / "postmaster.pid").exists(), said

    second, said = run_demo(without_pg_config(place), python)  # pgserver is there already
    assert "there is no pg_config: using PostgreSQL 16 from pgserver" in said
    assert "pgserver: installing" not in said
    assert second.rsplit("/", 1)[1] == first.rsplit("/", 1)[1] == "treadle_demo"
    assert not (cluster / "data" / "postmaster.pid").exists(), said


def test_the_demo_says_what_to_do_when_pgserver_cannot_be_set_up_either(place: Place) -> None:
    place.checkout.chmod(0o555)  # a checkout this user cannot write to: no .build for pgserver
    ran = subprocess.run(
        place.command([str(place.checkout / "scripts" / "demo")]), capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 1 and ran.stdout == ""
    assert f"pgserver: cannot write to {place.checkout}/.build" in ran.stderr
    assert f"could not be set up in {place.checkout}/.build/pgserver either" in ran.stderr
    assert f"must be installed into {place.share}/extension, which you cannot write to" in ran.stderr
    assert "sudo make install PG_CONFIG=" in ran.stderr
