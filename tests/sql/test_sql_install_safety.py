"""CREATE EXTENSION installs only into a schema treadle the installing role owns and
that holds nothing yet: a role that made the schema beforehand (schema squatting)
could otherwise plant objects that treadle's functions would run as their owner.
Through pg_tle (make test-pgtle) the same: the registration names schema treadle, and
CREATE EXTENSION takes a schema of that name that exists."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import INSTALL
from treadle import install


def _url(server: str, dbname: str) -> str:
    return server.rsplit("/", 1)[0] + "/" + dbname


@pytest.fixture
def empty_db(pg_server: str) -> Iterator[str]:
    """A database without treadle, and a role that may create schemas in it."""
    name = f"treadle_squat_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f'CREATE ROLE "{name}"')
        conn.execute(f'GRANT CREATE ON DATABASE "{name}" TO "{name}"')
    if INSTALL == "pgtle":  # registered, not created
        with psycopg.connect(_url(pg_server, name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_tle")
            install.run_script(conn, install.pgtle_script())
    yield name
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_a_schema_made_by_another_role_is_refused(pg_server: str, empty_db: str) -> None:
    with psycopg.connect(_url(pg_server, empty_db), autocommit=True) as conn:
        conn.execute(f'SET ROLE "{empty_db}"')
        conn.execute("CREATE SCHEMA treadle")
        conn.execute(
            "CREATE FUNCTION treadle.enqueue(name text, args json) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'"
        )
        conn.execute("RESET ROLE")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"belongs to role {empty_db}"):
            conn.execute("CREATE EXTENSION treadle")
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'treadle'").fetchone() == (0,)
        # nothing of treadle's was made beside the squatter's function
        assert conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'treadle'::regnamespace"
        ).fetchone() == (0,)


def test_an_own_schema_that_holds_objects_is_refused(pg_server: str, empty_db: str) -> None:
    with psycopg.connect(_url(pg_server, empty_db), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA treadle")
        conn.execute(f'GRANT CREATE ON SCHEMA treadle TO "{empty_db}"')
        conn.execute(f'SET ROLE "{empty_db}"')
        conn.execute("CREATE TABLE treadle.planted (x int)")
        conn.execute("RESET ROLE")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="already holds objects"):
            conn.execute("CREATE EXTENSION treadle")
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'treadle'").fetchone() == (0,)


def test_an_empty_own_schema_is_taken_and_closed_to_others(pg_server: str, empty_db: str) -> None:
    with psycopg.connect(_url(pg_server, empty_db), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA treadle")
        conn.execute("CREATE EXTENSION treadle")
        assert conn.execute("SELECT treadle.version()").fetchone() is not None
        conn.execute(f"SELECT treadle.grant_worker('{empty_db}')")
        conn.execute(f'SET ROLE "{empty_db}"')
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE FUNCTION treadle.enqueue_many(jobs json) RETURNS void LANGUAGE sql AS 'SELECT'")
        conn.execute("RESET ROLE")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'SET ROLE "{empty_db}"; DROP SCHEMA treadle CASCADE')
