"""The plain SQL install as the tests make it: by a role that may log in and nothing more,
given CREATE on the one database it installs into, as on a managed server."""

from __future__ import annotations

import psycopg

from tests.conftest import as_role, with_db

PLAIN_OWNER = "treadle_plain_owner"


def grant_plain_owner(url: str) -> None:
    """Make PLAIN_OWNER (roles are the cluster's: any test may be the first to need it) and
    give it CREATE on the database `url` names."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""DO $$ BEGIN
                             CREATE ROLE {PLAIN_OWNER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
                         EXCEPTION WHEN duplicate_object THEN NULL;
                         END $$""")
        conn.execute(f'GRANT CREATE ON DATABASE "{url.rsplit("/", 1)[1]}" TO {PLAIN_OWNER}')


def install_plain(server: str, dbname: str) -> None:
    """Install treadle in dbname as plain SQL (this package's script), made by PLAIN_OWNER."""
    from treadle import install

    grant_plain_owner(with_db(server, dbname))
    with psycopg.connect(as_role(with_db(server, dbname), PLAIN_OWNER), autocommit=True) as conn:
        install.apply(conn, install.plan_install(conn, mode="plain"))
