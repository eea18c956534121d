"""The pg_tle registration script (`make dist`: dist/treadle-VERSION.pgtle.sql).

Its shape, on every run: a stand-in schema `pgtle` with the functions the script calls,
under pg_tle's documented signatures, records what it is handed. The real script runs
against it: it registers exactly the extension's own scripts, the full one and each upgrade
(the released ones as released), word for word; sets the default version; and a second run
registers nothing again.

On a real pg_tle (make test-pgtle: the server preloads pg_tle and has no treadle files), the
tests marked below install, re-register, drop and uninstall treadle as a member of
pgtle_admin with CREATE on the database, as docs/operations.md says.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import EXTENSION_VERSION, INSTALL, ROOT, UPGRADES_FROM, NewDatabase
from tests.markers import marks_users
from tests.pgtle_install import PGTLE_OWNER, prepare_pgtle
from treadle import install
from treadle.install import InstallError, run_script

real_pgtle = pytest.mark.skipif(INSTALL != "pgtle", reason="needs a real pg_tle: make test-pgtle")
# the released upgrades, registered as released, then this version's
RELEASED_STEPS = sorted(
    (
        tuple(p.name.removeprefix("treadle--").removesuffix(".sql").split("--"))
        for p in (ROOT / "sql").glob("treadle--*--*.sql")
    ),
    key=lambda step: tuple(int(n) for n in step[1].split(".")),
)
STEPS = [s for s in RELEASED_STEPS if s[1] != EXTENSION_VERSION] + [(old, EXTENSION_VERSION) for old in UPGRADES_FROM]

# pg_tle's functions as its documentation declares them, each recording its call
STAND_IN = """
CREATE SCHEMA pgtle;
CREATE TABLE pgtle.calls (n serial, fn text, name text, version text, from_version text,
                          description text, ext text, requires text[], schema text);
CREATE FUNCTION pgtle.available_extensions() RETURNS TABLE (name name, default_version text, description text)
LANGUAGE sql AS $$ SELECT DISTINCT c.name::name, NULL::text, NULL::text FROM pgtle.calls AS c
                    WHERE c.fn IN ('install_extension', 'install_extension_version_sql')
                      AND c.n > coalesce((SELECT max(u.n) FROM pgtle.calls AS u
                                           WHERE u.fn = 'uninstall_extension' AND u.name = c.name), 0) $$;
CREATE FUNCTION pgtle.available_extension_versions()
RETURNS TABLE (name name, version text, superuser boolean, trusted boolean, relocatable boolean,
               schema name, requires name[], description text)
LANGUAGE sql AS $$ SELECT c.name::name, c.version, false, false, false,
                            (SELECT i.schema FROM pgtle.calls AS i WHERE i.fn = 'install_extension' AND i.name = c.name
                              ORDER BY i.n DESC LIMIT 1)::name, NULL::name[], NULL::text
                     FROM pgtle.calls AS c WHERE c.fn IN ('install_extension', 'install_extension_version_sql')
                      AND c.n > coalesce((SELECT max(u.n) FROM pgtle.calls AS u
                                           WHERE u.fn = 'uninstall_extension' AND u.name = c.name), 0) $$;
CREATE FUNCTION pgtle.extension_update_paths(name name) RETURNS TABLE (source text, target text, path text)
LANGUAGE sql AS $$ SELECT c.from_version, c.version, c.from_version || '--' || c.version
                     FROM pgtle.calls AS c WHERE c.fn = 'install_update_path' AND c.name = $1 $$;
CREATE FUNCTION pgtle.install_extension(name text, version text, description text, ext text,
                                        requires text[] DEFAULT NULL::text[], schema text DEFAULT NULL)
RETURNS text
LANGUAGE sql AS $$ INSERT INTO pgtle.calls (fn, name, version, description, ext, requires, schema)
                   VALUES ('install_extension', name, version, description, ext, requires, schema) RETURNING 'OK' $$;
CREATE FUNCTION pgtle.uninstall_extension(extname text) RETURNS boolean
LANGUAGE sql AS $$ INSERT INTO pgtle.calls (fn, name) VALUES ('uninstall_extension', extname) RETURNING true $$;
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
@marks_users(pytest.mark.subprocess)
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
        *[("install_update_path", "treadle", to, old) for old, to in STEPS],
        ("set_default_version", "treadle", EXTENSION_VERSION, None),
    ]
    full = stand_in.execute("SELECT ext, description, requires, schema FROM pgtle.calls WHERE fn = 'install_extension'")
    ext, description, requires, schema = full.fetchone() or (None, None, None, None)
    assert ext == extension_script(f"treadle--{EXTENSION_VERSION}.sql")
    assert "\\echo" not in ext  # pg_tle runs the text as SQL, not through psql
    assert description and description in (ROOT / "treadle.control").read_text()
    assert requires == []
    assert schema == "treadle"  # as the control file says: CREATE EXTENSION makes it
    for old, to in STEPS:
        upgrade = stand_in.execute(
            "SELECT ext FROM pgtle.calls WHERE fn = 'install_update_path' AND from_version = %s", (old,)
        ).fetchone()
        assert upgrade == (extension_script(f"treadle--{old}--{to}.sql"),)


def test_a_second_run_registers_nothing_again(stand_in: psycopg.Connection, pgtle_script: str) -> None:
    run_script(stand_in, pgtle_script)
    first = calls(stand_in)
    run_script(stand_in, pgtle_script)
    assert calls(stand_in) == [*first, ("set_default_version", "treadle", EXTENSION_VERSION, None)]


def test_an_older_registration_gets_this_version_beside_it(stand_in: psycopg.Connection, pgtle_script: str) -> None:
    """A database that registered an older treadle through pg_tle, with a schema: the full
    script of this version is added as a version of the same extension, not installed a
    second time."""
    stand_in.execute("SELECT pgtle.install_extension('treadle', '0.0.1', 'old', 'SELECT 1', '{}', 'treadle')")
    run_script(stand_in, pgtle_script)
    assert [c for c in calls(stand_in) if c[0] != "install_update_path"] == [
        ("install_extension", "treadle", "0.0.1", None),
        ("install_extension_version_sql", "treadle", EXTENSION_VERSION, None),
        ("set_default_version", "treadle", EXTENSION_VERSION, None),
    ]


def test_an_unused_registration_without_a_schema_is_made_again(stand_in: psycopg.Connection, pgtle_script: str) -> None:
    """Registered by 0.3.0 or earlier (no schema, so CREATE EXTENSION could not work) and
    not created in this database: registered again, with the schema."""
    stand_in.execute("SELECT pgtle.install_extension('treadle', '0.3.0', 'old', 'SELECT 1')")
    run_script(stand_in, pgtle_script)
    assert [c for c in calls(stand_in) if c[0] != "install_update_path"] == [
        ("install_extension", "treadle", "0.3.0", None),
        ("uninstall_extension", "treadle", None, None),
        ("install_extension", "treadle", EXTENSION_VERSION, None),
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


def test_pgtle_mode_needs_pg_tle_in_the_database(new_database: NewDatabase) -> None:
    with psycopg.connect(new_database(None), autocommit=True) as conn:
        with pytest.raises(InstallError, match="CREATE EXTENSION pg_tle"):
            install.plan_install(conn, mode="pgtle")
        assert install.installed(conn) is None


@pytest.mark.skipif(INSTALL != "extension", reason="needs treadle's files on the server")
def test_pgtle_mode_refuses_a_server_with_treadle_files(stand_in: psycopg.Connection) -> None:
    """pg_tle refuses to register an extension whose control file the server has: say so first."""
    with pytest.raises(InstallError, match=r"extension files.*--mode extension"):
        install.plan_install(stand_in, mode="pgtle")
    assert calls(stand_in) == []


@pytest.fixture
def pgtle_db(new_database: NewDatabase) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
    """An empty database with pg_tle: (a superuser's connection, PGTLE_OWNER's)."""
    url = new_database(None)
    owner_url = prepare_pgtle(url)
    with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(owner_url, autocommit=True) as owner:
        yield admin, owner


@real_pgtle
def test_create_extension_makes_schema_treadle_for_its_role(
    pgtle_db: tuple[psycopg.Connection, psycopg.Connection], pgtle_script: str
) -> None:
    """docs/operations.md: the registration script, then CREATE EXTENSION, as a member of
    pgtle_admin with CREATE on the database; no CREATE SCHEMA beforehand."""
    _, owner = pgtle_db
    run_script(owner, pgtle_script)
    owner.execute("CREATE EXTENSION treadle")
    assert owner.execute(
        "SELECT e.extversion, e.extnamespace::regnamespace::text, pg_get_userbyid(n.nspowner)"
        " FROM pg_extension AS e, pg_namespace AS n WHERE e.extname = 'treadle' AND n.nspname = 'treadle'"
    ).fetchone() == (EXTENSION_VERSION, "treadle", PGTLE_OWNER)
    assert owner.execute("SELECT treadle.version()").fetchone() == (EXTENSION_VERSION,)
    assert install.installed(owner) == install.Installed("pgtle", EXTENSION_VERSION)
    assert install.plan_install(owner).sql == ""
    assert install.plan_upgrade(owner).sql == ""
    with pytest.raises(InstallError, match="through pg_tle, not as plain SQL"):
        install.plan_install(owner, mode="plain")


@real_pgtle
def test_a_registration_that_failed_before_now_creates(
    pgtle_db: tuple[psycopg.Connection, psycopg.Connection], pgtle_script: str
) -> None:
    """The 0.3.0 registration named no schema, so its CREATE EXTENSION failed on the schema
    guard; this version's script registers it again, and CREATE EXTENSION works."""
    _, owner = pgtle_db
    released = extension_script("treadle--0.3.0.sql")
    owner.execute("SELECT pgtle.install_extension('treadle', '0.3.0', 'old', %s, ARRAY[]::text[])", (released,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema treadle belongs to role <NULL>"):
        owner.execute("CREATE EXTENSION treadle")
    run_script(owner, pgtle_script)
    owner.execute("CREATE EXTENSION treadle")
    assert owner.execute("SELECT treadle.version()").fetchone() == (EXTENSION_VERSION,)


@real_pgtle
def test_drop_and_uninstall_then_install_again(
    pgtle_db: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    """Removing treadle (docs/operations.md): DROP EXTENSION, DROP SCHEMA, then
    pgtle.uninstall_extension unregisters it; `treadle install --mode pgtle` brings it back."""
    _, owner = pgtle_db
    install.apply(owner, install.plan_install(owner, mode="pgtle"))
    owner.execute("SELECT treadle.enqueue('job')")
    owner.execute("DROP EXTENSION treadle")
    owner.execute("DROP SCHEMA treadle")
    assert owner.execute("SELECT pgtle.uninstall_extension('treadle')").fetchone() == (True,)
    assert owner.execute("SELECT count(*) FROM pgtle.available_extensions() WHERE name = 'treadle'").fetchone() == (0,)
    assert install.installed(owner) is None
    install.apply(owner, install.plan_install(owner, mode="pgtle"))
    assert install.installed(owner) == install.Installed("pgtle", EXTENSION_VERSION)
    assert owner.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


@real_pgtle
@pytest.mark.subprocess  # the treadle command
def test_the_commands_install_and_upgrade_through_pg_tle(
    pgtle_db: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    """`treadle install --mode pgtle`, run as a user runs it, then `treadle upgrade`, which
    finds the pg_tle install and has nothing to do; --dry-run prints the registration."""
    _, owner = pgtle_db
    url = owner.info.dsn
    dry = treadle_command("install", "--mode", "pgtle", "--dsn", url, "--dry-run")
    assert (
        "pgtle.install_extension('treadle'" in dry and f"CREATE EXTENSION treadle VERSION '{EXTENSION_VERSION}';" in dry
    )
    assert install.installed(owner) is None
    assert treadle_command("install", "--mode", "pgtle", "--dsn", url) == (
        f"done: register treadle {EXTENSION_VERSION} through pg_tle and install it as an extension "
        f"(owned by {PGTLE_OWNER})\n"
    )
    assert treadle_command("upgrade", "--dsn", url) == (
        f"treadle {EXTENSION_VERSION} is installed (pgtle, owned by {PGTLE_OWNER}): nothing to upgrade\n"
    )
    assert install.installed(owner) == install.Installed("pgtle", EXTENSION_VERSION)


def treadle_command(*args: str) -> str:
    done = subprocess.run(
        [Path(sys.executable).with_name("treadle"), *args], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"treadle {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


@real_pgtle
def test_a_server_with_treadle_files_refuses_the_registration(
    pgtle_db: tuple[psycopg.Connection, psycopg.Connection], pgtle_script: str
) -> None:
    """docs/operations.md: pg_tle registers no extension whose control file the server has,
    and `treadle install --mode pgtle` says so first. The control file is put in the test
    server's extension folder for this test only."""
    _, owner = pgtle_db
    sharedir = subprocess.run(["pg_config", "--sharedir"], check=True, capture_output=True, text=True).stdout
    control = Path(sharedir.strip()) / "extension" / "treadle.control"
    assert not control.exists(), "make test-pgtle's server has no treadle files"
    shutil.copyfile(ROOT / "treadle.control", control)
    try:
        with pytest.raises(
            psycopg.errors.ObjectNotInPrerequisiteState, match="control file already exists for the treadle extension"
        ):
            run_script(owner, pgtle_script)
        with pytest.raises(InstallError, match=r"extension files.*--mode extension"):
            install.plan_install(owner, mode="pgtle")
    finally:
        control.unlink()
    assert owner.execute("SELECT count(*) FROM pgtle.available_extensions() WHERE name = 'treadle'").fetchone() == (0,)
    run_script(owner, pgtle_script)  # without the file, it registers
    assert install.registered_in_pgtle(owner)
