"""The pg_tle registration script (`make dist`: dist/treadle-VERSION.pgtle.sql).

pg_tle cannot be installed here (it is a C extension that no package of this machine
carries), so a stand-in schema `pgtle` with the functions the script calls, under their
documented signatures, records what it is handed. The test runs the real script against it
and checks its shape: it registers exactly the extension's own scripts, the full one and each
upgrade, word for word; sets the default version; and a second run registers nothing again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import EXTENSION_VERSION, ROOT, UPGRADES_FROM, NewDatabase
from treadle import install
from treadle.install import run_script

# pg_tle's functions as its documentation declares them, each recording its call
STAND_IN = """
CREATE SCHEMA pgtle;
CREATE TABLE pgtle.calls (n serial, fn text, name text, version text, from_version text,
                          description text, ext text, requires text[]);
CREATE FUNCTION pgtle.available_extensions() RETURNS TABLE (name name, default_version text, description text)
LANGUAGE sql AS $$ SELECT DISTINCT c.name::name, NULL::text, NULL::text FROM pgtle.calls AS c
                    WHERE c.fn IN ('install_extension', 'install_extension_version_sql') $$;
CREATE FUNCTION pgtle.available_extension_versions()
RETURNS TABLE (name name, version text, superuser boolean, trusted boolean, relocatable boolean,
               schema name, requires name[], description text)
LANGUAGE sql AS $$ SELECT c.name::name, c.version, false, false, false, NULL::name, NULL::name[], NULL::text
                     FROM pgtle.calls AS c WHERE c.fn IN ('install_extension', 'install_extension_version_sql') $$;
CREATE FUNCTION pgtle.extension_update_paths(name name) RETURNS TABLE (source text, target text, path text)
LANGUAGE sql AS $$ SELECT c.from_version, c.version, c.from_version || '--' || c.version
                     FROM pgtle.calls AS c WHERE c.fn = 'install_update_path' AND c.name = $1 $$;
CREATE FUNCTION pgtle.install_extension(name text, version text, description text, ext text,
                                        requires text[] DEFAULT NULL::text[]) RETURNS text
LANGUAGE sql AS $$ INSERT INTO pgtle.calls (fn, name, version, description, ext, requires)
                   VALUES ('install_extension', name, version, description, ext, requires) RETURNING 'OK' $$;
CREATE FUNCTION pgtle.install_extension_version_sql(name text, version text, ext text) RETURNS text
LANGUAGE sql AS $$ INSERT INTO pgtle.calls (fn, name, version, ext)
                   VALUES ('install_extension_version_sql', name, version, ext) RETURNING 'OK' $$;
CREATE FUNCTION pgtle.install_update_path(name text, fromvers text, tovers text, ext text) RETURNS text
LANGUAGE sql AS $$ INSERT INTO pgtle.calls (fn, name, version, from_version, ext)
                   VALUES ('install_update_path', name, tovers, fromvers, ext) RETURNING 'OK' $$;
CREATE FUNCTION pgtle.set_default_version(name text, version text) RETURNS boolean
LANGUAGE sql AS $$ INSERT INTO pgtle.calls (fn, name, version)
                   VALUES ('set_default_version', name, version) RETURNING true $$;
"""


def extension_script(name: str) -> str:
    """An extension script as CREATE or ALTER EXTENSION runs it: without the banner and psql guard."""
    text = (ROOT / "sql" / name).read_text()
    return text.split("\\quit\n", 1)[1].removeprefix("\n")


@pytest.fixture(scope="module")
def pgtle_script() -> str:
    return subprocess.run(
        [ROOT / "scripts" / "build-sql", "pgtle", *UPGRADES_FROM], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def stand_in(new_database: NewDatabase) -> Iterator[psycopg.Connection]:
    url = new_database(None)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(STAND_IN)
        yield conn


def calls(conn: psycopg.Connection) -> list[tuple[str | None, ...]]:
    return conn.execute("SELECT fn, name, version, from_version FROM pgtle.calls ORDER BY n").fetchall()


def test_it_registers_the_extension_scripts_word_for_word(stand_in: psycopg.Connection, pgtle_script: str) -> None:
    run_script(stand_in, pgtle_script)
    assert calls(stand_in) == [
        ("install_extension", "treadle", EXTENSION_VERSION, None),
        *[("install_update_path", "treadle", EXTENSION_VERSION, old) for old in UPGRADES_FROM],
        ("set_default_version", "treadle", EXTENSION_VERSION, None),
    ]
    full = stand_in.execute("SELECT ext, description, requires FROM pgtle.calls WHERE fn = 'install_extension'")
    ext, description, requires = full.fetchone() or (None, None, None)
    assert ext == extension_script(f"treadle--{EXTENSION_VERSION}.sql")
    assert "\\echo" not in ext  # pg_tle runs the text as SQL, not through psql
    assert description and description in (ROOT / "treadle.control").read_text()
    assert requires == []
    for old in UPGRADES_FROM:
        upgrade = stand_in.execute(
            "SELECT ext FROM pgtle.calls WHERE fn = 'install_update_path' AND from_version = %s", (old,)
        ).fetchone()
        assert upgrade == (extension_script(f"treadle--{old}--{EXTENSION_VERSION}.sql"),)


def test_a_second_run_registers_nothing_again(stand_in: psycopg.Connection, pgtle_script: str) -> None:
    run_script(stand_in, pgtle_script)
    first = calls(stand_in)
    run_script(stand_in, pgtle_script)
    assert calls(stand_in) == [*first, ("set_default_version", "treadle", EXTENSION_VERSION, None)]


def test_an_older_registration_gets_this_version_beside_it(stand_in: psycopg.Connection, pgtle_script: str) -> None:
    """A database that registered an older treadle through pg_tle: the full script of this
    version is added as a version of the same extension, not installed a second time."""
    stand_in.execute("SELECT pgtle.install_extension('treadle', '0.0.1', 'old', 'SELECT 1')")
    run_script(stand_in, pgtle_script)
    assert [c for c in calls(stand_in) if c[0] != "install_update_path"] == [
        ("install_extension", "treadle", "0.0.1", None),
        ("install_extension_version_sql", "treadle", EXTENSION_VERSION, None),
        ("set_default_version", "treadle", EXTENSION_VERSION, None),
    ]


def test_treadle_install_sees_the_registered_extension(stand_in: psycopg.Connection, pgtle_script: str) -> None:
    """pg_available_extension_versions does not list pg_tle's extensions: `treadle install`
    asks pg_tle too before it chooses between the extension and plain SQL."""
    assert not install.registered_in_pgtle(stand_in)
    run_script(stand_in, pgtle_script)
    assert install.registered_in_pgtle(stand_in)


def test_without_pgtle_nothing_is_registered(new_database: NewDatabase) -> None:
    url = new_database(None)
    with psycopg.connect(url) as conn:
        assert not install.registered_in_pgtle(conn)
