"""Fixtures shared by every test: a real PostgreSQL server and throwaway databases.

The server is the one `make test` started (TREADLE_TEST_SERVER, a postgres URL),
or, when that is unset, a throwaway cluster this session starts itself with
scripts/pgcluster (the extension must be installed: `make install`).

Every database a test uses comes from one factory, `new_database` (or
`new_module_database` for a database one module's tests share): by default a
clone of a template that has `CREATE EXTENSION treadle` done, so tests never see
each other's jobs; `new_database(template=None)` gives an empty one. Each is
dropped when its test (or module) ends; a copy of the template in which nothing but rows and
sequences changed is put back as the template made it instead, for a later test of the same
process (tests/database_pool.py; TREADLE_TEST_DATABASES=fresh turns that off).

With TREADLE_TEST_INSTALL=plain (scripts/run-tests sets it) the template has the plain
SQL install instead, made by a role that has only CREATE on it; tests marked
`extension_only` are skipped then. With TREADLE_TEST_INSTALL=pgtle (make test-pgtle) the
template has treadle registered through pg_tle and created by a member of pgtle_admin
(tests/pgtle_install.py); tests marked `extension_only` run (pg_tle's is an extension too),
and a test that creates the extension again does it as that role (create_extension).

Under pytest-xdist (make test runs `-n`) each worker is its own process with its own
template (TEMPLATE names the process), so workers share only the server.

The markers `subprocess` and `browser` follow from what a test uses: a fixture that starts a
process or a browser says so (`@marks_users(pytest.mark.subprocess)`), and every test that
uses it, however indirectly, is marked at collection. A test that starts a process while
it carries neither marker fails before the process starts (`no_unmarked_processes`), so
no test can slip into `make test-fast`'s tier by forgetting its marker.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.database_pool import DatabasePool
from tests.markers import mark_fixture_users, no_unmarked_processes, processes_allowed

ROOT = Path(__file__).resolve().parent.parent
# the extension's version, from its one source
EXTENSION_VERSION = re.findall(r"^default_version\s*=\s*'([^']+)'", (ROOT / "treadle.control").read_text(), re.M)[0]
# the releases it upgrades from: those with a migration in sql/upgrade, oldest first
UPGRADES_FROM = sorted(
    (p.name.split("--")[0] for p in (ROOT / "sql" / "upgrade").glob(f"*--{EXTENSION_VERSION}.sql")),
    key=lambda v: tuple(int(n) for n in v.split(".")),
)
# every earlier release, oldest first: each has its script, kept as released, and
# ALTER EXTENSION UPDATE reaches this version from it through the upgrades between
RELEASES = sorted(
    (
        m[1]
        for p in (ROOT / "sql").glob("treadle--*.sql")
        if (m := re.fullmatch(r"treadle--(\d+\.\d+\.\d+)\.sql", p.name)) and m[1] != EXTENSION_VERSION
    ),
    key=lambda v: tuple(int(n) for n in v.split(".")),
)
TEMPLATE = f"treadle_template_{os.getpid()}"
INSTALL = os.environ.get("TREADLE_TEST_INSTALL", "extension")  # or "plain", "pgtle"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_fixture_users(items)
    if INSTALL == "plain":
        skip = pytest.mark.skip(reason="an extension's own behaviour: this run tests the plain SQL install")
        for item in items:
            if item.get_closest_marker("extension_only"):
                item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with no_unmarked_processes(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with no_unmarked_processes(item):
        return (yield)


class NewDatabase(Protocol):
    """new_database(template=TEMPLATE) -> the URL of a new database on the test server."""

    def __call__(self, template: str | None = TEMPLATE) -> str: ...


def _own_handlers(logger: logging.Logger) -> list[logging.Handler]:
    """`logger`'s handlers but pytest's own (its capture, live logging), which it adds and removes by phase."""
    return [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]


@pytest.fixture(autouse=True)
def root_logging_kept() -> Iterator[None]:
    """A test leaves the root logger as it found it (its handlers, its level).

    A handler added by code run in-process (the CLI's `worker` configures logging) keeps the
    stream it was given: the test's captured stderr, closed when the test ends. Every later
    record at its level, in any test of the process, then prints `--- Logging error ---`.
    The test fails, and the root logger is put back for the tests after it.
    """
    root = logging.getLogger()
    handlers, level = _own_handlers(root), root.level
    yield
    added = [h for h in _own_handlers(root) if h not in handlers]
    changed = (added, root.level) != ([], level) or any(h not in root.handlers for h in handlers)
    for handler in added:
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    assert not changed, f"the test changed the root logger: handlers added {added}, level {logging.getLevelName(level)}"


def with_db(url: str, dbname: str) -> str:
    """The same server URL (postgresql://...), naming another database."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def as_role(url: str, role: str) -> str:
    """The same database URL, logging in as another role (the test cluster trusts local logins)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))


def _sigint_handled() -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def sigint_reaches_children() -> Iterator[None]:
    """Keep this process's SIGINT handler Python's own, before and after each test. A child
    process inherits an ignored SIGINT (the browser tests' driver leaves it ignored), and a
    test that stops a child with Ctrl-C would then wait on it forever."""
    _sigint_handled()
    yield
    _sigint_handled()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    url = os.environ.get("TREADLE_TEST_SERVER")
    if url:
        yield url
        return
    folder = tempfile.mkdtemp(prefix="treadle-test-")
    script = str(ROOT / "scripts" / "pgcluster")
    with processes_allowed():
        url = subprocess.run([script, "start", folder], check=True, capture_output=True, text=True).stdout.strip()
    try:
        yield url
    finally:
        with processes_allowed():
            subprocess.run([script, "stop", folder], check=False)


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> Iterator[str]:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    if INSTALL == "plain":
        from tests.plain_install import install_plain

        install_plain(pg_server, TEMPLATE)
    elif INSTALL == "pgtle":
        from tests.pgtle_install import install_pgtle

        install_pgtle(with_db(pg_server, TEMPLATE))
    else:
        with psycopg.connect(with_db(pg_server, TEMPLATE), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION treadle")
    yield TEMPLATE
    with psycopg.connect(pg_server, autocommit=True) as conn:
        for name in _pool.ready if _pool else []:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


def _database_name() -> str:
    return f"treadle_t_{uuid.uuid4().hex[:12]}"


# this process's copies of TEMPLATE put back for the next test (tests/database_pool.py), unless
# TREADLE_TEST_DATABASES=fresh: then every test's database is created and dropped
_pool: DatabasePool | None = None


def _template_pool(server: str) -> DatabasePool | None:
    global _pool
    if _pool is None and os.environ.get("TREADLE_TEST_DATABASES") != "fresh":
        _pool = DatabasePool(server, TEMPLATE, with_db, _database_name)
    return _pool


class Databases:
    """Creates databases on the test server and drops every one it created (or puts a
    copy of the template back for the next test: tests/database_pool.py)."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.pool = _template_pool(server)
        self.created: list[str] = []

    def new(self, template: str | None = TEMPLATE) -> str:
        """A new database: a clone of `template` (treadle's template by default), or empty for None."""
        if self.pool and template == TEMPLATE:
            name = self.pool.new()
        else:
            name = _database_name()
            with psycopg.connect(self.server, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        self.created.append(name)
        return with_db(self.server, name)

    def drop_all(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as conn:
            for name in reversed(self.created):
                drop = self.pool.give_back(name, conn) if self.pool else name
                if drop is not None:
                    conn.execute(f'DROP DATABASE IF EXISTS "{drop}" WITH (FORCE)')
        self.created.clear()


@pytest.fixture
def new_database(pg_server: str, template_db: str) -> Iterator[NewDatabase]:
    """new_database(template=TEMPLATE): a database for this test, dropped after it."""
    databases = Databases(pg_server)
    yield databases.new
    databases.drop_all()


@pytest.fixture(scope="module")
def new_module_database(pg_server: str, template_db: str) -> Iterator[NewDatabase]:
    """The same factory, for databases a module's tests share (dropped after the module)."""
    databases = Databases(pg_server)
    yield databases.new
    databases.drop_all()


@pytest.fixture
def dsn(new_database: NewDatabase) -> str:
    """A fresh database with treadle installed; dropped after the test."""
    return new_database()


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database, as the superuser."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="session")
def make_role(pg_server: str) -> Iterator[Callable[[str], str]]:
    """make_role(purpose) -> the name of a new login role, dropped when the session ends.

    Roles belong to the cluster, not to a database: grant them what they need in the
    test's database, which is dropped (taking those grants with it) before the role is.
    """
    made: list[str] = []

    def make(purpose: str) -> str:
        name = f"treadle_{purpose}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'CREATE ROLE "{name}" LOGIN')
        made.append(name)
        return name

    yield make
    with psycopg.connect(pg_server, autocommit=True) as conn:
        for name in made:
            try:
                conn.execute(f'DROP ROLE IF EXISTS "{name}"')
            except psycopg.errors.DependentObjectsStillExist:
                pass  # a database that still holds its grants outlived its test; the cluster is throwaway
