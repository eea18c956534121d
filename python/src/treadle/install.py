"""Install and upgrade treadle's SQL in a database: `treadle install` and `treadle upgrade`.

treadle comes in three forms, with the same schema, functions and rights:

- extension: `CREATE EXTENSION treadle`, then `ALTER EXTENSION treadle UPDATE`. The server
  must have treadle's extension files (`make install` on it, the Docker image).
- pgtle: the same extension, its scripts registered in the database through pg_tle
  (Trusted Language Extensions: the registration script this package ships, the same as
  dist/treadle-VERSION.pgtle.sql), then `CREATE EXTENSION treadle`; a member of
  pgtle_admin with CREATE on the database may run both. An upgrade registers the new
  version, then `ALTER EXTENSION treadle UPDATE`.
- plain: the plain SQL scripts this package ships (plain_sql/, built from the same sources),
  which any role with CREATE on the database may run: managed servers, where nobody can
  copy extension files.

The version this package installs is its own: the package and the extension share one
version. Both commands find what is installed, refuse what they cannot do (a downgrade,
the other form), and do nothing when the database is already at this version.

Whoever installs treadle owns it: its definer functions, its clock, its tenant rules run as
that role. So both commands name the owner (the extension's, or for plain SQL the owner of
schema treadle), and refuse to go on, installed or not yet upgraded, when the connecting role
may not act as that owner: only the owner, a member of it that has its privileges (INHERIT,
as PostgreSQL's own ownership checks ask) or a superuser may. A treadle someone else
installed first is then reported, never taken for the application's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

import psycopg
from psycopg.rows import tuple_row

from treadle._compat import EXTENSION_FORM_VERSION as _EXTENSION
from treadle.errors import TreadleError

Mode = Literal["extension", "plain", "pgtle"]
MODES: Final = ("extension", "plain", "pgtle")

# the version of the scripts this package ships and installs
VERSION: Final = importlib.metadata.version("treadle")

# (to_regprocedure raises when the role may not use the schema: that is asked first)
_SCHEMA = (
    "SELECT pg_catalog.to_regnamespace('treadle') IS NOT NULL,"
    " coalesce(pg_catalog.has_schema_privilege(pg_catalog.to_regnamespace('treadle'), 'USAGE'), false)"
)
_HAS_PLAIN = "SELECT pg_catalog.to_regprocedure('treadle.version()') IS NOT NULL"
# the owner of each form, and whether the connecting role has its privileges (a superuser has)
_EXTENSION_OWNER = (
    "SELECT pg_catalog.pg_get_userbyid(e.extowner), pg_catalog.pg_has_role(e.extowner, 'USAGE'), current_user"
    " FROM pg_catalog.pg_extension AS e WHERE e.extname = 'treadle'"
)
_SCHEMA_OWNER = (
    "SELECT pg_catalog.pg_get_userbyid(n.nspowner), pg_catalog.pg_has_role(n.nspowner, 'USAGE'), current_user"
    " FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'treadle'"
)
_PLAIN_VERSION = "SELECT treadle.version()"
_AVAILABLE = (
    "SELECT EXISTS (SELECT FROM pg_catalog.pg_available_extension_versions WHERE name = 'treadle' AND version = %s)"
)
# extensions registered through pg_tle are not in pg_available_extension_versions
_HAS_PGTLE = "SELECT pg_catalog.to_regprocedure('pgtle.available_extension_versions()') IS NOT NULL"
_PGTLE_AVAILABLE = (
    "SELECT EXISTS (SELECT FROM pgtle.available_extension_versions() WHERE name = 'treadle' AND version = %s)"
)
_PGTLE_REGISTERED = "SELECT EXISTS (SELECT FROM pgtle.available_extensions() WHERE name = 'treadle')"
# the server's own files of treadle (any version): pg_tle refuses to register an extension
# of the same name then ("control file already exists")
_FILES = "SELECT EXISTS (SELECT FROM pg_catalog.pg_available_extensions WHERE name = 'treadle')"


class InstallError(TreadleError):
    """What is installed does not allow what was asked (the message says what to do instead)."""


class NotOwner(InstallError):
    """treadle is installed, owned by a role the connecting role may not act as."""


@dataclass(frozen=True)
class Installed:
    """treadle as a database has it."""

    mode: Mode
    version: str


@dataclass(frozen=True)
class Owner:
    """Who owns treadle in a database, who asks, and whether the asker may act as the owner."""

    name: str
    user: str
    may_act: bool


@dataclass(frozen=True)
class Plan:
    """What a command will run: its SQL (empty when there is nothing to do) and what it does."""

    summary: str
    sql: str = ""


def installed(conn: psycopg.Connection[Any]) -> Installed | None:
    """The form and version of treadle in the database, or None when it has none."""
    extension = _value(conn, _EXTENSION)
    if extension is not None:
        pgtle = _value(conn, _HAS_PGTLE) and _value(conn, _PGTLE_REGISTERED) and not _value(conn, _FILES)
        return Installed("pgtle" if pgtle else "extension", str(extension))
    with _pinned(conn) as cur:
        exists, usable = cur.execute(_SCHEMA).fetchone() or (False, False)
    if not exists:
        return None
    if not usable:
        holder = owner(conn, "plain")
        raise NotOwner(
            f"schema treadle exists, owned by role {holder.name}, but role {holder.user} may not use it: "
            f"run this as {holder.name}, the role that owns it"
        )
    if _value(conn, _HAS_PLAIN):
        return Installed("plain", str(_value(conn, _PLAIN_VERSION)))
    return None


def owner(conn: psycopg.Connection[Any], mode: Mode) -> Owner:
    """The owner of the treadle installed in `mode`: the extension's, or schema treadle's."""
    with _pinned(conn) as cur:
        row = cur.execute(_SCHEMA_OWNER if mode == "plain" else _EXTENSION_OWNER).fetchone()
    if row is None:
        raise InstallError("treadle is not installed in this database")
    return Owner(str(row[0]), str(row[2]), bool(row[1]))


def check_owner(conn: psycopg.Connection[Any], current: Installed, command: str) -> Owner:
    """The owner of what is installed; NotOwner unless the connecting role may act as it."""
    found = owner(conn, current.mode)
    if not found.may_act:
        drop = "DROP SCHEMA treadle CASCADE" if current.mode == "plain" else "DROP EXTENSION treadle CASCADE"
        raise NotOwner(
            f"treadle {current.version} ({current.mode}) in this database is owned by role {found.name}, "
            f"not by {found.user}, the role connecting: `treadle {command}` does nothing to it. "
            f"Whoever installed it first owns it, and its definer functions run as {found.name}. "
            f"If {found.name} is the intended owner, run this as {found.name} (or a member of it); if not, "
            f"check what it has done, then drop it ({drop}, as {found.name} or a superuser) and install "
            "as the intended owner (docs/operations.md, who owns treadle)"
        )
    return found


def _value(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of a query's first row (None when it has none), whatever the
    connection's row factory."""
    with _pinned(conn) as cur:
        row = cur.execute(query, params or None).fetchone()
    return None if row is None else row[0]


# the search_path this module's own queries and the scripts it runs bind with
_PATH: Final = "pg_catalog, pg_temp"


@contextmanager
def _pinned(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor whose queries bind to pg_catalog only, whatever the session's search_path:
    an `=` or a function another role planted in a schema on that path (public, first)
    would otherwise run as the role that installs. The path is the transaction's own
    (one of its own, on an autocommit connection) and is put back after."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        before = _first(cur.execute("SELECT pg_catalog.current_setting('search_path')").fetchone())
        cur.execute("SELECT pg_catalog.set_config('search_path', %s, true)", (_PATH,))
        yield cur
        cur.execute("SELECT pg_catalog.set_config('search_path', %s, true)", (before,))


def _first(row: tuple[Any, ...] | None) -> Any:
    return None if row is None else row[0]


def plan_install(conn: psycopg.Connection[Any], mode: Mode | None = None) -> Plan:
    """Install this version: as an extension when the server offers it (or `mode` says so),
    else as plain SQL; nothing when it is installed already."""
    current = installed(conn)
    if current is not None:
        _check_mode(current, mode)
        found = check_owner(conn, current, "install")
        if current.version == VERSION:
            return Plan(
                f"treadle {VERSION} is already installed ({current.mode}, owned by {found.name}): nothing to do"
            )
        if _newer(current.version, VERSION):
            raise _downgrade(current)
        raise InstallError(
            f"treadle {current.version} is installed ({current.mode}): run `treadle upgrade` to bring it to {VERSION}"
        )
    if mode is None:
        mode = "extension" if _offered(conn) else "plain"
    if mode == "extension":
        _require_offered(conn)
        return Plan(
            f"install treadle {VERSION} as an extension (owned by {_user(conn)})",
            f"CREATE EXTENSION treadle VERSION '{VERSION}';\n",
        )
    if mode == "pgtle":
        _require_pgtle(conn)
        return Plan(
            f"register treadle {VERSION} through pg_tle and install it as an extension (owned by {_user(conn)})",
            pgtle_script() + f"\nCREATE EXTENSION treadle VERSION '{VERSION}';\n",
        )
    return Plan(
        f"install treadle {VERSION} as plain SQL (schema treadle, owned by {_user(conn)})",
        plain_script(f"treadle-{VERSION}.sql"),
    )


def plan_upgrade(conn: psycopg.Connection[Any], mode: Mode | None = None) -> Plan:
    """Upgrade what is installed to this version, in the form it has; nothing when it is there."""
    current = installed(conn)
    if current is None:
        raise InstallError("treadle is not installed in this database: run `treadle install`")
    _check_mode(current, mode)
    found = check_owner(conn, current, "upgrade")
    if current.version == VERSION:
        return Plan(f"treadle {VERSION} is installed ({current.mode}, owned by {found.name}): nothing to upgrade")
    if _newer(current.version, VERSION):
        raise _downgrade(current)
    if current.mode == "pgtle":
        _require_pgtle(conn)
        return Plan(
            f"register treadle {VERSION} through pg_tle and upgrade the extension from {current.version}",
            pgtle_script() + f"\nALTER EXTENSION treadle UPDATE TO '{VERSION}';\n",
        )
    if current.mode == "extension":
        _require_offered(conn)
        return Plan(
            f"upgrade the treadle extension from {current.version} to {VERSION}",
            f"ALTER EXTENSION treadle UPDATE TO '{VERSION}';\n",
        )
    steps = _plain_upgrade_path(current.version)
    if steps is None:
        raise InstallError(
            f"this package ({VERSION}) has no upgrade of a plain install from "
            f"{current.version}: upgrade with the package of a version in between first"
        )
    return Plan(
        f"upgrade plain treadle from {current.version} to {VERSION}"
        + (f" (through {', '.join(to for to in steps[:-1])})" if len(steps) > 1 else ""),
        _PIN_SESSION
        + "".join(
            plain_script(f"treadle-{start}--{to}.sql")
            for start, to in zip([current.version, *steps[:-1]], steps, strict=True)
        ),
    )


# first in a plain upgrade's SQL, for whoever runs what --dry-run prints: a released upgrade
# on the way (0.2.0 -> 0.3.0) sets no search_path of its own
_PIN_SESSION: Final = f"-- bind every name to pg_catalog, whatever this session's path\nSET search_path = {_PATH};\n\n"


def _plain_upgrade_path(start: str) -> list[str] | None:
    """The versions a plain install of `start` passes through to reach this one, by the
    upgrade scripts this package ships (each one transaction, run in turn); None when they
    do not reach it."""
    shipped = [p.name for p in (importlib.resources.files("treadle") / "plain_sql").iterdir()]
    steps: list[str] = []
    version = start
    while version != VERSION:
        prefix = f"treadle-{version}--"
        following = sorted(
            (name[len(prefix) : -len(".sql")] for name in shipped if name.startswith(prefix)),
            key=_version_key,
        )
        if not following:
            return None
        version = following[-1]  # the longest step the package has
        steps.append(version)
    return steps


def apply(conn: psycopg.Connection[Any], plan: Plan) -> None:
    """Run a plan's SQL. Each script is one transaction of its own (it says BEGIN and COMMIT),
    so the connection must be in autocommit mode. The scripts run with the session's
    search_path set to pg_catalog alone, and the session's own put back after: each script
    of this version sets it itself, but a released upgrade on the way (0.2.0 -> 0.3.0) did not."""
    if not plan.sql:
        return
    if not conn.autocommit:
        raise InstallError("a script runs on a connection in autocommit mode")
    with conn.cursor(row_factory=tuple_row) as cur:
        before = _first(cur.execute("SELECT pg_catalog.current_setting('search_path')").fetchone())
        cur.execute("SELECT pg_catalog.set_config('search_path', %s, false)", (_PATH,))
        try:
            run_script(conn, plan.sql)
        finally:
            cur.execute("SELECT pg_catalog.set_config('search_path', %s, false)", (before,))


def run_script(conn: psycopg.Connection[Any], sql: str) -> None:
    """Run a script of several statements on an autocommit connection. When it fails inside
    its own BEGIN, the server keeps that transaction open and aborted: roll it back."""
    if not conn.autocommit:
        raise InstallError("a script runs on a connection in autocommit mode")
    try:
        conn.execute(sql)  # no parameters: sent as one simple query, several statements
    except psycopg.Error:
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            conn.execute("ROLLBACK")
        raise


def plain_script(name: str) -> str:
    """A plain SQL script this package ships (plain_sql/NAME)."""
    return (importlib.resources.files("treadle") / "plain_sql" / name).read_text(encoding="utf-8")


def pgtle_script() -> str:
    """The pg_tle registration of this version (plain_sql/treadle-VERSION.pgtle.sql): the
    extension's own scripts, with the upgrades from earlier releases."""
    return plain_script(f"treadle-{VERSION}.pgtle.sql")


def _check_mode(current: Installed, mode: Mode | None) -> None:
    if mode is not None and mode != current.mode:
        raise InstallError(
            f"treadle {current.version} is installed as {_form(current.mode)}, "
            f"not as {_form(mode)}: drop it first to change its form"
        )


def _form(mode: Mode) -> str:
    return {"extension": "an extension", "plain": "plain SQL", "pgtle": "an extension through pg_tle"}[mode]


def _offered(conn: psycopg.Connection[Any]) -> bool:
    """Whether CREATE EXTENSION can install this version: the server has its files, or
    pg_tle has it registered."""
    return bool(_value(conn, _AVAILABLE, (VERSION,))) or registered_in_pgtle(conn)


def registered_in_pgtle(conn: psycopg.Connection[Any]) -> bool:
    """Whether pg_tle has this version of treadle registered in the database."""
    return bool(_value(conn, _HAS_PGTLE)) and bool(_value(conn, _PGTLE_AVAILABLE, (VERSION,)))


def _require_offered(conn: psycopg.Connection[Any]) -> None:
    if not _offered(conn):
        raise InstallError(
            f"the server has no files of the treadle {VERSION} extension: run `make install` on the "
            "server, or register it through pg_tle (dist/treadle-VERSION.pgtle.sql), "
            "or install plain SQL instead (--mode plain)"
        )


def _require_pgtle(conn: psycopg.Connection[Any]) -> None:
    if not _value(conn, _HAS_PGTLE):
        raise InstallError(
            "pg_tle is not installed in this database: CREATE EXTENSION pg_tle first (the server "
            "needs shared_preload_libraries = 'pg_tle'), or install plain SQL instead (--mode plain)"
        )
    if _value(conn, _FILES):
        raise InstallError(
            "the server has treadle's extension files, and pg_tle registers no extension of the same "
            "name: install it as an extension instead (--mode extension)"
        )


def _user(conn: psycopg.Connection[Any]) -> str:
    return str(_value(conn, "SELECT current_user"))


def _version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        raise InstallError(f"cannot compare version {version!r} with {VERSION}") from None


def _newer(version: str, than: str) -> bool:
    return _version_key(version) > _version_key(than)


def _downgrade(current: Installed) -> InstallError:
    return InstallError(
        f"the database has treadle {current.version}, newer than this package's "
        f"{VERSION}: treadle never downgrades; use the Python package {current.version}"
    )


# the command line: `treadle install` and `treadle upgrade` (cli.py wires them in)
COMMANDS: Final = {
    "install": (plan_install, "install treadle's SQL in a database (extension or plain SQL)"),
    "upgrade": (plan_upgrade, "upgrade treadle's SQL in a database to this package's version"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=MODES,
        help="the form to install: extension (the server has its files, or pg_tle has them "
        "registered), plain (SQL any role with CREATE on the database may run) or pgtle "
        "(registered through pg_tle, by a member of pgtle_admin); default: what is installed, "
        "else extension when the server offers it, else plain",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the SQL it would run, and run nothing")


def run_command(name: str, dsn: str, mode: Mode | None, dry_run: bool) -> int:
    """`treadle install` or `treadle upgrade`: print what it does (or the SQL, with dry_run)."""
    planner = COMMANDS[name][0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = planner(conn, mode)
        if dry_run:
            print(f"-- {plan.summary}\n{plan.sql}", end="")
            return 0
        apply(conn, plan)
    print(plan.summary if not plan.sql else f"done: {plan.summary}")
    return 0
