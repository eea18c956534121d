"""The plain SQL install: run by a role with nothing but CREATE on its database, it gives the
same treadle as the extension; it refuses to run twice; pg_dump keeps its jobs; and a plain
upgrade script checks the installed version before it changes anything."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.catalog import describe_difference, snapshot
from tests.conftest import EXTENSION_VERSION, ROOT, UPGRADES_FROM, NewDatabase, as_role
from tests.plain_install import PLAIN_OWNER, grant_plain_owner, install_plain
from treadle import install
from treadle.install import run_script


def build_sql(*args: str) -> str:
    return subprocess.run([ROOT / "scripts" / "build-sql", *args], check=True, capture_output=True, text=True).stdout


def bindir() -> Path:
    """The client tools of the server under test (scripts/run-tests puts them first on PATH)."""
    out = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True, text=True).stdout
    return Path(out.strip())


@pytest.fixture(scope="module")
def plain(pg_server: str, new_module_database: NewDatabase) -> Iterator[str]:
    """The URL of a database with the plain install made by PLAIN_OWNER, connecting as that role."""
    url = new_module_database(None)
    install_plain(pg_server, url.rsplit("/", 1)[1])
    yield as_role(url, PLAIN_OWNER)


@pytest.fixture(scope="module")
def extension(new_module_database: NewDatabase) -> Iterator[psycopg.Connection]:
    url = new_module_database(None)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION treadle")
        yield conn


def test_the_installer_has_no_other_right(plain: str) -> None:
    with psycopg.connect(plain) as conn:
        assert conn.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (False, False, False, False)
        assert conn.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'treadle'"
        ).fetchone() == (PLAIN_OWNER,)


def test_the_plain_install_is_the_extension(plain: str, extension: psycopg.Connection) -> None:
    with psycopg.connect(plain) as conn:
        difference = describe_difference(
            snapshot(conn, extension=False), snapshot(extension, extension=False), "plain", "extension"
        )
    assert difference == "", "the plain install differs from the extension:\n" + difference


def test_the_plain_install_works(plain: str) -> None:
    with psycopg.connect(plain, autocommit=True) as conn:
        job = conn.execute("SELECT treadle.enqueue('hello', '{\"n\": 1}')").fetchone()
        assert job is not None
        claimed = conn.execute("SELECT id, lease_token FROM treadle.claim('w')").fetchone()
        assert claimed is not None and claimed[0] == job[0]
        assert conn.execute("SELECT treadle.complete(%s, %s)", claimed).fetchone() == ("completed",)
        assert conn.execute("SELECT treadle.version()").fetchone() == (EXTENSION_VERSION,)


@pytest.mark.subprocess
def test_it_refuses_to_run_twice_and_changes_nothing(plain: str) -> None:
    script = build_sql("plain")
    with psycopg.connect(plain, autocommit=True) as conn:
        before = snapshot(conn, extension=False)
        with pytest.raises(psycopg.errors.DuplicateSchema, match="schema treadle already exists"):
            run_script(conn, script)
        assert describe_difference(before, snapshot(conn, extension=False), "before", "after") == ""


@pytest.mark.subprocess
def test_psql_runs_it_without_extension_files(new_database: NewDatabase) -> None:
    """What a user of a managed server runs: psql -f, as a role with CREATE on the database."""
    url = new_database(None)
    grant_plain_owner(url)
    script = ROOT / "python" / "src" / "treadle" / "plain_sql" / f"treadle-{EXTENSION_VERSION}.sql"
    subprocess.run(
        [bindir() / "psql", as_role(url, PLAIN_OWNER), "-q", "-v", "ON_ERROR_STOP=1", "-f", script],
        check=True,
        capture_output=True,
    )
    with psycopg.connect(as_role(url, PLAIN_OWNER)) as conn:
        assert conn.execute("SELECT treadle.version()").fetchone() == (EXTENSION_VERSION,)


@pytest.mark.subprocess
def test_pg_dump_keeps_the_jobs_of_a_plain_install(new_database: NewDatabase, plain: str, tmp_path: Path) -> None:
    """Without pg_extension_config_dump, the tables are ordinary ones: a dump has their rows."""
    with psycopg.connect(plain, autocommit=True) as conn:
        kept = conn.execute("SELECT treadle.enqueue('kept', '{\"x\": 1}', queue => 'dumped')").fetchone()
        assert kept is not None
    dump = tmp_path / "plain.dump"
    subprocess.run([bindir() / "pg_dump", "-Fc", "-f", dump, plain], check=True, capture_output=True)
    url = new_database(None)
    subprocess.run([bindir() / "pg_restore", "-d", url, dump], check=True, capture_output=True)
    with psycopg.connect(as_role(url, PLAIN_OWNER), autocommit=True) as conn:
        assert conn.execute("SELECT name, args FROM treadle.jobs WHERE id = %s", kept).fetchone() == (
            "kept",
            {"x": 1},
        )
        later = conn.execute("SELECT treadle.enqueue('later')").fetchone()
        assert later is not None and later[0] > kept[0]


def plain_release(version: str) -> str:
    """A release's plain script, kept as released in sql/plain; for a release that shipped
    none (0.1.0), its extension script as a plain install of it would have been."""
    released = ROOT / "sql" / "plain" / f"treadle-{version}.sql"
    if released.is_file():
        return released.read_text()
    text = (ROOT / "sql" / f"treadle--{version}.sql").read_text()
    text = re.sub(r"^\\echo .*$|^SELECT pg_catalog\.pg_extension_config_dump\(.*\);$", "", text, flags=re.MULTILINE)
    return f"BEGIN;\nCREATE SCHEMA treadle;\n{text}\nCOMMIT;\n"


@pytest.mark.subprocess
@pytest.mark.parametrize("old", UPGRADES_FROM)
def test_a_plain_upgrade_gives_the_plain_install(new_database: NewDatabase, plain: str, old: str) -> None:
    upgrade = build_sql("plain-upgrade", old)
    url = new_database(None)
    grant_plain_owner(url)
    with psycopg.connect(as_role(url, PLAIN_OWNER), autocommit=True) as conn:
        run_script(conn, plain_release(old))
        conn.execute("SELECT treadle.enqueue('from-before')")
        run_script(conn, upgrade)
        upgraded = snapshot(conn, extension=False)
        assert conn.execute("SELECT name FROM treadle.jobs").fetchall() == [("from-before",)]
    with psycopg.connect(plain) as conn:
        fresh = snapshot(conn, extension=False)
    difference = describe_difference(upgraded, fresh, "plain upgraded", "plain fresh")
    assert difference == "", "a plain upgrade differs from a plain install:\n" + difference


@pytest.mark.subprocess
@pytest.mark.parametrize("old", UPGRADES_FROM)
def test_a_plain_upgrade_checks_the_installed_version_first(
    plain: str, extension: psycopg.Connection, old: str
) -> None:
    upgrade = build_sql("plain-upgrade", old)
    with psycopg.connect(plain, autocommit=True) as conn:
        before = snapshot(conn, extension=False)
        with pytest.raises(
            psycopg.errors.ObjectNotInPrerequisiteState,
            match=f"upgrades treadle {old} to {EXTENSION_VERSION}, but {EXTENSION_VERSION} is installed",
        ):
            run_script(conn, upgrade)
        assert describe_difference(before, snapshot(conn, extension=False), "before", "after") == ""
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="installed as an extension"):
        run_script(extension, upgrade)


@pytest.mark.subprocess
def test_a_plain_upgrade_needs_a_plain_install(new_database: NewDatabase) -> None:
    url = new_database(None)
    with psycopg.connect(url, autocommit=True) as conn:
        for old in UPGRADES_FROM:
            with pytest.raises(psycopg.errors.UndefinedFunction, match="no plain install"):
                run_script(conn, build_sql("plain-upgrade", old))


def test_what_is_installed_reads_with_any_row_factory(plain: str, extension: psycopg.Connection) -> None:
    with psycopg.connect(plain, row_factory=dict_row) as conn:
        assert install.installed(conn) == install.Installed("plain", EXTENSION_VERSION)
    assert install.installed(extension) == install.Installed("extension", EXTENSION_VERSION)


def test_treadle_upgrade_chains_the_released_plain_upgrades(new_database: NewDatabase, plain: str) -> None:
    """A 0.2.0 plain install reaches this version through every upgrade the package ships,
    each in turn, and ends equal to a plain install of this version."""
    url = new_database(None)
    grant_plain_owner(url)
    with psycopg.connect(as_role(url, PLAIN_OWNER), autocommit=True) as conn:
        run_script(conn, plain_release("0.2.0"))
        conn.execute("SELECT treadle.enqueue('from-0.2.0')")
        plan = install.plan_upgrade(conn)
        assert plan.summary == f"upgrade plain treadle from 0.2.0 to {EXTENSION_VERSION} (through 0.3.0)"
        install.apply(conn, plan)
        assert install.installed(conn) == install.Installed("plain", EXTENSION_VERSION)
        assert conn.execute("SELECT name FROM treadle.jobs").fetchall() == [("from-0.2.0",)]
        upgraded = snapshot(conn, extension=False)
    with psycopg.connect(plain) as conn:
        fresh = snapshot(conn, extension=False)
    assert describe_difference(upgraded, fresh, "plain upgraded", "plain fresh") == ""
