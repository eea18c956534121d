"""The extension installs, drops and installs again in a database of a real server."""

import psycopg
import pytest

from tests.conftest import EXTENSION_VERSION
from tests.pgtle_install import create_extension

pytestmark = pytest.mark.extension_only  # DROP and CREATE EXTENSION


def test_drop_and_create_again(conn: psycopg.Connection) -> None:
    assert conn.execute("select treadle.version()").fetchone() == (EXTENSION_VERSION,)
    conn.execute("drop extension treadle")
    leftover = conn.execute(
        "select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'treadle'"
    ).fetchone()
    assert leftover == (0,)
    create_extension(conn)
    job = conn.execute("select treadle.enqueue('x')").fetchone()
    assert job is not None and job[0] >= 1
