"""`treadle install` and `treadle upgrade`, run as the command a user runs: they find what is
installed, install or upgrade either form, do nothing the second time, print the SQL without
running it on --dry-run, and refuse a downgrade or a change of form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.catalog import snapshot
from tests.conftest import EXTENSION_VERSION, NewDatabase, as_role
from tests.plain_install import PLAIN_OWNER

pytestmark = pytest.mark.subprocess  # the treadle command

TREADLE = Path(sys.executable).with_name("treadle")
OLD = "0.1.0"  # an earlier release, and one that had no plain install


def treadle(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([TREADLE, *args], check=False, capture_output=True, text=True, timeout=120)
    assert (done.returncode == 0) == ok, f"treadle {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done


def installed(url: str) -> tuple[str, str] | None:
    """(form, version) of treadle in the database, read from the catalog."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'treadle'").fetchone()
        if row is not None:
            return "extension", row[0]
        if conn.execute("SELECT to_regprocedure('treadle.version()') IS NOT NULL").fetchone() == (True,):
            version = conn.execute("SELECT treadle.version()").fetchone()
            assert version is not None
            return "plain", version[0]
    return None


@pytest.fixture
def empty(new_database: NewDatabase) -> str:
    """An empty database (no treadle)."""
    return new_database(None)


def test_install_then_again_is_the_extension_once(empty: str) -> None:
    dry = treadle("install", "--dsn", empty, "--dry-run")
    assert f"CREATE EXTENSION treadle VERSION '{EXTENSION_VERSION}';" in dry.stdout
    assert installed(empty) is None
    assert "done: install" in treadle("install", "--dsn", empty).stdout
    assert installed(empty) == ("extension", EXTENSION_VERSION)
    assert "already installed" in treadle("install", "--dsn", empty).stdout
    assert "nothing to upgrade" in treadle("upgrade", "--dsn", empty).stdout


def test_upgrade_an_old_extension(empty: str) -> None:
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute(f"CREATE EXTENSION treadle VERSION '{OLD}'")
    refused = treadle("install", "--dsn", empty, ok=False)
    assert f"treadle {OLD} is installed" in refused.stderr and "treadle upgrade" in refused.stderr
    assert (
        f"ALTER EXTENSION treadle UPDATE TO '{EXTENSION_VERSION}';"
        in treadle("upgrade", "--dsn", empty, "--dry-run").stdout
    )
    assert installed(empty) == ("extension", OLD)
    treadle("upgrade", "--dsn", empty)
    assert installed(empty) == ("extension", EXTENSION_VERSION)


def test_plain_install_by_a_role_with_create_only(empty: str) -> None:
    dbname = empty.rsplit("/", 1)[1]
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute(f"""DO $$ BEGIN CREATE ROLE {PLAIN_OWNER} LOGIN;
                         EXCEPTION WHEN duplicate_object THEN NULL; END $$""")
        conn.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO {PLAIN_OWNER}')
    owner = as_role(empty, PLAIN_OWNER)
    dry = treadle("install", "--dsn", owner, "--mode", "plain", "--dry-run")
    assert "CREATE SCHEMA treadle;" in dry.stdout and installed(empty) is None
    treadle("install", "--dsn", owner, "--mode", "plain")
    assert installed(empty) == ("plain", EXTENSION_VERSION)
    assert f"already installed (plain, owned by {PLAIN_OWNER})" in treadle("install", "--dsn", owner).stdout
    assert "nothing to upgrade" in treadle("upgrade", "--dsn", owner).stdout
    changed = treadle("install", "--dsn", owner, "--mode", "extension", ok=False)
    assert "installed as plain SQL, not as an extension" in changed.stderr


def test_a_failed_install_leaves_nothing(empty: str) -> None:
    """A role without CREATE on the database: the plain script fails and nothing stays."""
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute(f"""DO $$ BEGIN CREATE ROLE {PLAIN_OWNER} LOGIN;
                         EXCEPTION WHEN duplicate_object THEN NULL; END $$""")
        before = snapshot(conn, extension=False)
    failed = treadle("install", "--dsn", as_role(empty, PLAIN_OWNER), "--mode", "plain", ok=False)
    assert "permission denied" in failed.stderr
    assert installed(empty) is None
    with psycopg.connect(empty) as conn:
        assert snapshot(conn, extension=False) == before


def test_upgrade_refuses_a_downgrade(empty: str) -> None:
    """A newer treadle than this package (a plain one, made here by hand) is left alone."""
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute(
            "CREATE SCHEMA treadle; CREATE FUNCTION treadle.version() RETURNS text"
            " LANGUAGE sql IMMUTABLE RETURN '99.0.0'"
        )
    for command in ("install", "upgrade"):
        refused = treadle(command, "--dsn", empty, ok=False)
        assert "newer than this package" in refused.stderr and "never downgrades" in refused.stderr
    assert installed(empty) == ("plain", "99.0.0")


def test_a_plain_upgrade_this_package_lacks_is_refused(empty: str) -> None:
    """0.1.0 had no plain install, so this package ships no plain upgrade from it."""
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute(
            f"CREATE SCHEMA treadle; CREATE FUNCTION treadle.version() RETURNS text"
            f" LANGUAGE sql IMMUTABLE RETURN '{OLD}'"
        )
    refused = treadle("upgrade", "--dsn", empty, ok=False)
    assert f"no upgrade of a plain install from {OLD}" in refused.stderr


def test_nothing_to_upgrade_says_install(empty: str) -> None:
    assert "not installed" in treadle("upgrade", "--dsn", empty, ok=False).stderr


def test_a_role_that_may_not_use_the_schema_is_told_so(empty: str) -> None:
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute(f"""DO $$ BEGIN CREATE ROLE {PLAIN_OWNER} LOGIN;
                         EXCEPTION WHEN duplicate_object THEN NULL; END $$""")
        conn.execute("CREATE SCHEMA treadle")  # the superuser's, and nobody else may use it
    refused = treadle("upgrade", "--dsn", as_role(empty, PLAIN_OWNER), ok=False)
    assert f"role {PLAIN_OWNER} may not use it" in refused.stderr
