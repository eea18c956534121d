"""Which extension versions this package speaks, and the one read of the installed version."""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg.rows import tuple_row

from .errors import ExtensionMissing, InvalidArgument, UnsupportedVersion

# the extension versions this client speaks (older ones lack functions it calls)
SUPPORTED_VERSIONS: Final = frozenset({"0.4.0"})

# The version of the extension form (pg_extension); none for a plain install.
EXTENSION_FORM_VERSION: Final = "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'treadle'"

# The installed version, either form: the extension's, or else a plain install's (`treadle
# install --mode plain`), read from its treadle.version() body in the catalog rather than by
# a call: a call to a function that may not exist would put the caller's transaction into an
# error state. It reads pg_catalog only and cannot fail.
EXTENSION_VERSION: Final = (
    f"SELECT coalesce(({EXTENSION_FORM_VERSION}), "
    "substring(pg_catalog.pg_get_function_sqlbody(pg_catalog.to_regprocedure('treadle.version()')) "
    "FROM '''([^'']+)'''))"
)


def read_extension_version(conn: psycopg.Connection[Any]) -> None:
    """Raise ExtensionMissing or UnsupportedVersion unless `conn`'s database has a treadle this package speaks
    (InvalidArgument for a connection whose client_encoding is not UTF8: check_encoding)."""
    check_encoding(conn.info)
    # the caller's connection may have any row factory: ask for a tuple
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(EXTENSION_VERSION)
        row = cur.fetchone()
    check_version(None if row is None else row[0], conn.info.dbname)


async def read_extension_version_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """`read_extension_version` for an AsyncConnection."""
    check_encoding(conn.info)
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(EXTENSION_VERSION)
        row = await cur.fetchone()
    check_version(None if row is None else row[0], conn.info.dbname)


def check_encoding(info: psycopg.ConnectionInfo) -> None:
    """InvalidArgument for a connection whose client_encoding is not UTF8.

    Under SQL_ASCII (psycopg's "ascii") psycopg returns every text value as bytes, which
    nothing in this package reads: the installed version itself would read as b'0.4.0'.
    Under any other encoding but UTF8, psycopg sends and reads JSON as UTF-8 whatever the
    connection's encoding, so a job's args would be stored garbled ({"a": "é"} back as
    {"a": "Ã©"} under LATIN1). UTF8 works on a database of any encoding that can hold the
    text (a SQL_ASCII database stores the bytes it is sent, and returns them unconverted).
    """
    if info.encoding != "utf-8":
        raise InvalidArgument(
            f"the connection to database {info.dbname!r} has client_encoding "
            f"{info.parameter_status('client_encoding')}, in which psycopg "
            "does not carry treadle's text and JSON faithfully: connect with client_encoding=UTF8 "
            "(in the connection string, or PGCLIENTENCODING=UTF8)"
        )


def check_version(installed: object, dbname: str) -> None:
    """Raise ExtensionMissing or UnsupportedVersion for what the database says is installed."""
    problem = version_problem(installed, dbname)
    if problem is not None:
        raise ExtensionMissing(problem) if installed is None else UnsupportedVersion(problem)


def version_problem(installed: object, dbname: str) -> str | None:
    """What is wrong with the treadle `installed` in database `dbname`, and the command that fixes it; None: nothing."""
    if installed is None:
        return (
            f"the treadle extension is not installed in database {dbname!r}: "
            "run CREATE EXTENSION treadle (after make install on the server), or `treadle install`"
        )
    if installed in SUPPORTED_VERSIONS:
        return None
    supported = ", ".join(sorted(SUPPORTED_VERSIONS))
    oldest = min((_release(version) for version in SUPPORTED_VERSIONS), default=None)
    if oldest is not None and _release(str(installed)) < oldest:
        return (
            f"database {dbname!r} has treadle {installed}, older than this package, which speaks {supported}: "
            f"upgrade it with `treadle upgrade` (or ALTER EXTENSION treadle UPDATE)"
        )
    return (
        f"database {dbname!r} has treadle {installed}, but this package speaks {supported}: "
        f"install the Python package that matches (pip install 'treadle=={installed}'), "
        "or, for an older database, `treadle upgrade` (or ALTER EXTENSION treadle UPDATE)"
    )


def _release(version: str) -> tuple[int, ...]:
    """A version's numbers, for ordering (parts that are not numbers count as 0)."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))
