"""DROP EXTENSION treadle, with data and grants in place, leaves no object behind
(the schema CREATE EXTENSION made may stay, empty), and CREATE EXTENSION works again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.pgtle_install import create_extension
from tests.sql.sqlcalls import Connect

pytestmark = pytest.mark.extension_only  # DROP and CREATE EXTENSION


# Every kind of object a script could leave in the schema
LEFTOVERS = """
select 'relation ' || relname from pg_class where relnamespace = 'treadle'::regnamespace
union all select 'function ' || proname from pg_proc where pronamespace = 'treadle'::regnamespace
union all select 'type ' || typname from pg_type where typnamespace = 'treadle'::regnamespace
union all select 'operator ' || oprname from pg_operator where oprnamespace = 'treadle'::regnamespace
union all select 'collation ' || collname from pg_collation where collnamespace = 'treadle'::regnamespace
union all select 'text search ' || cfgname from pg_ts_config where cfgnamespace = 'treadle'::regnamespace
union all select 'conversion ' || conname from pg_conversion where connamespace = 'treadle'::regnamespace
"""


@pytest.fixture
def worker_role(pg_server: str, dsn: str) -> Iterator[str]:
    """A role of this test's own (roles are cluster-wide), dropped with what it was granted."""
    role = f"treadle_drop_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}"')
    yield role
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP OWNED BY "{role}"')
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP ROLE "{role}"')


def test_drop_extension_leaves_nothing_and_create_works_again(connect: Connect, worker_role: str) -> None:
    conn = connect()
    conn.execute("select treadle.grant_worker(%s::regrole)", (worker_role,))
    conn.execute("select treadle.grant_dashboard(%s::regrole)", (worker_role,))
    conn.execute("select treadle.enqueue('x', every => '1 minute')")
    conn.execute("select treadle.complete(id, lease_token) from treadle.claim('w')")
    conn.execute("select treadle.start_workflow('w', steps => array['a', 'b'])")
    conn.execute("select treadle.define_workflow('w', array['a', 'b'])")
    conn.execute("select treadle.worker_seen('w', 'host', 1, array['default'], 1)")
    assert conn.execute(LEFTOVERS).fetchall(), "the extension made objects in its schema"

    conn.execute("drop extension treadle")

    assert conn.execute(LEFTOVERS).fetchall() == []
    assert conn.execute("select count(*) from pg_extension where extname = 'treadle'").fetchone() == (0,)
    # nothing outside the schema depends on, or belongs to, what was dropped
    assert conn.execute(
        "select count(*) from pg_depend where refclassid = 'pg_extension'::regclass "
        "and refobjid not in (select oid from pg_extension)"
    ).fetchone() == (0,)

    create_extension(conn)
    job_id = conn.execute("select treadle.enqueue('again')").fetchone()
    assert job_id == (1,)
    claimed = conn.execute("select id, attempt from treadle.claim('w')").fetchall()
    assert claimed == [(1, 1)]
    assert conn.execute("select count(*) from treadle.workflow_runs").fetchone() == (0,)
