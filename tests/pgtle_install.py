"""treadle registered through pg_tle as the tests make it (make test-pgtle: the server
preloads pg_tle and has no treadle files): by a role that may log in, is a member of
pgtle_admin and has CREATE on the one database it installs into, as on a managed server."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg

from tests.conftest import ROOT, as_role

PGTLE_OWNER = "treadle_pgtle_owner"


def prepare_pgtle(url: str) -> str:
    """pg_tle in the database of url (a superuser's), and PGTLE_OWNER allowed to register and
    create there: the URL of that database as PGTLE_OWNER."""
    dbname = urlsplit(url).path.lstrip("/")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""DO $$ BEGIN
                             CREATE ROLE {PGTLE_OWNER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
                         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;  -- (another worker's)
                         END $$""")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_tle")
        conn.execute(f"GRANT pgtle_admin TO {PGTLE_OWNER}")
        conn.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO {PGTLE_OWNER}')
    return as_role(url, PGTLE_OWNER)


def install_pgtle(url: str) -> str:
    """Register this package's treadle through pg_tle in the database of url and create it,
    as PGTLE_OWNER (`treadle install --mode pgtle`); returns the URL as PGTLE_OWNER."""
    from treadle import install

    owner_url = prepare_pgtle(url)
    with psycopg.connect(owner_url, autocommit=True) as conn:
        install.apply(conn, install.plan_install(conn, mode="pgtle"))
    return owner_url


def install_release(conn: psycopg.Connection, version: str) -> None:
    """A release installed through pg_tle as its own documentation said: its script
    registered (with no schema: releases up to 0.3.0 named none), schema treadle created,
    then CREATE EXTENSION. conn: as PGTLE_OWNER, in a database prepare_pgtle set up."""
    text = (ROOT / "sql" / f"treadle--{version}.sql").read_text().split("\\quit\n", 1)[1].removeprefix("\n")
    conn.execute("SELECT pgtle.install_extension('treadle', %s, 'treadle', %s, ARRAY[]::text[])", (version, text))
    conn.execute("CREATE SCHEMA treadle")
    conn.execute(f"CREATE EXTENSION treadle VERSION '{version}'")


def create_extension(conn: psycopg.Connection) -> None:
    """CREATE EXTENSION treadle again after a DROP EXTENSION, on a superuser's connection, as
    the role that installs it in this run: the superuser itself, or through pg_tle
    PGTLE_OWNER, whose schema treadle DROP EXTENSION leaves (the schema guard admits its
    owner only)."""
    from tests.conftest import INSTALL

    if INSTALL != "pgtle":
        conn.execute("CREATE EXTENSION treadle")
        return
    conn.execute(f"SET ROLE {PGTLE_OWNER}")
    try:
        conn.execute("CREATE EXTENSION treadle")
    finally:
        conn.execute("RESET ROLE")
