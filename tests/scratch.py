"""Throwaway databases on the test server, for tests that install treadle their own way."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


def with_db(url: str, dbname: str) -> str:
    """The same server URL, naming another database."""
    return url.rsplit("/", 1)[0] + "/" + dbname


@contextmanager
def scratch_database(server: str, hint: str, owner: str | None = None) -> Iterator[str]:
    """An empty database (from template0, so without treadle), dropped on exit; yields its URL."""
    name = f"treadle_{hint}_{uuid.uuid4().hex[:8]}"
    owned = f' OWNER "{owner}"' if owner else ""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0{owned}')
    try:
        yield with_db(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The role that makes plain installs in tests: it may log in and nothing more, and gets
# CREATE on the one database it installs into, as on a managed server.
PLAIN_OWNER = "treadle_plain_owner"


def as_role(url: str, role: str) -> str:
    """The same URL, logging in as another role (the test server trusts local logins)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[1]}"


def install_plain(server: str, dbname: str) -> None:
    """Install treadle in dbname as plain SQL (this package's script), made by PLAIN_OWNER."""
    from treadle import install

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"""DO $$ BEGIN
                             CREATE ROLE {PLAIN_OWNER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
                         EXCEPTION WHEN duplicate_object THEN NULL;
                         END $$""")
    with psycopg.connect(with_db(server, dbname), autocommit=True) as conn:
        conn.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO {PLAIN_OWNER}')
    with psycopg.connect(as_role(with_db(server, dbname), PLAIN_OWNER), autocommit=True) as conn:
        install.apply(conn, install.plan_install(conn, mode="plain"))
