"""The test databases put back for later tests (tests/database_pool.py): a later test finds what
a fresh copy of the template holds, and a database whose catalog changed is never used again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.conftest import with_db
from tests.database_pool import DatabasePool


@pytest.fixture
def pool(pg_server: str, template_db: str) -> Iterator[DatabasePool]:
    """A pool of its own over the template, every database it named dropped after the test."""
    prefix = f"treadle_t_pool_{uuid.uuid4().hex[:8]}_"
    pool = DatabasePool(pg_server, template_db, with_db, lambda: prefix + uuid.uuid4().hex[:12])
    yield pool
    with psycopg.connect(pg_server, autocommit=True) as admin:
        for (name,) in admin.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,)):
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _oid(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row is not None, name
    return int(row[0])


def _state(url: str) -> tuple[Any, ...]:
    """What a test would see first: rows, the next ids, statistics, sizes, settings."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM treadle.jobs), (SELECT count(*) FROM treadle.queues),
                      (SELECT count(*) FROM treadle.workflow_runs),
                      (SELECT count(*) FROM pg_statistic WHERE starelid = 'treadle.jobs'::regclass),
                      (SELECT array_agg((relpages, reltuples) ORDER BY oid) FROM pg_class
                        WHERE relnamespace = 'treadle'::regnamespace),
                      (SELECT array_agg(pg_total_relation_size(oid) ORDER BY oid) FROM pg_class
                        WHERE relnamespace = 'treadle'::regnamespace AND relkind = 'r'),
                      (SELECT coalesce(sum(n_tup_ins + seq_scan + coalesce(idx_scan, 0)), 0) FROM pg_stat_user_tables),
                      current_setting('treadle.now', true)"""
        ).fetchone()
        assert row is not None
        job = conn.execute("SELECT treadle.enqueue('first', '{}'::jsonb)").fetchone()
        assert job is not None
        return (*row, job[0])


def test_a_database_given_back_is_as_a_fresh_copy_under_a_new_name(pool: DatabasePool, pg_server: str) -> None:
    with psycopg.connect(pg_server, autocommit=True) as admin:
        fresh = _state(with_db(pg_server, pool.new()))
        name = pool.new()
        oid = _oid(admin, name)
        with psycopg.connect(with_db(pg_server, name), autocommit=True) as conn:
            conn.execute("SELECT treadle.enqueue('n', '{}'::jsonb) FROM generate_series(1, 500)")
            conn.execute("SELECT treadle.set_queue('q', concurrency => 3)")
            conn.execute("SELECT treadle.pause('q')")
            conn.execute("SELECT treadle.define_workflow('w', ARRAY['a', 'b'])")
            conn.execute("SELECT treadle.start_workflow('w', '{}'::jsonb)")
            conn.execute("SELECT treadle.enqueue('n', '{}'::jsonb) FROM generate_series(1, 3000)")
            conn.execute("DELETE FROM treadle.jobs")  # (every job: the table's pages can go)
            conn.execute("VACUUM treadle.jobs")  # (the table's pages freed, not its indexes')
            conn.execute("SELECT pg_advisory_lock(42)")
            held = psycopg.connect(with_db(pg_server, name), autocommit=True)  # a session the test left open
            assert pool.give_back(name, admin) is None, pool.changed
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")  # ended
        with pytest.raises(psycopg.OperationalError, match="does not exist"):
            psycopg.connect(with_db(pg_server, name))  # a process of the ended test finds no database
        again = pool.new()
        assert again != name and _oid(admin, again) == oid  # (the same database, renamed)
        assert _state(with_db(pg_server, again)) == fresh


def test_a_database_the_test_dropped_is_told_to_be_dropped(pool: DatabasePool, pg_server: str) -> None:
    with psycopg.connect(pg_server, autocommit=True) as admin:
        name = pool.new()
        admin.execute(f'DROP DATABASE "{name}"')
        assert pool.give_back(name, admin) == name  # (DROP DATABASE IF EXISTS, as before)
        assert pool.changed == "the test dropped or renamed it"


@pytest.mark.parametrize(
    "change",
    [
        "CREATE TABLE public.accounts (id int)",
        "GRANT USAGE ON SCHEMA treadle TO PUBLIC",
        "COMMENT ON TABLE treadle.jobs IS 'changed'",
        "ALTER TABLE treadle.jobs SET (fillfactor = 50)",
        "DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET treadle.now = %L', current_database(), '2030-01-01'); END$$",
        "DO $$BEGIN EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM PUBLIC', current_database()); END$$",
        "SELECT lo_create(0)",
        "CREATE EXTENSION IF NOT EXISTS pgcrypto",
        "DROP SCHEMA public",  # (rows deleted only)
    ],
)
def test_a_database_whose_catalog_changed_is_dropped(pool: DatabasePool, pg_server: str, change: str) -> None:
    with psycopg.connect(pg_server, autocommit=True) as admin:
        pool.give_back(pool.new(), admin)  # (the pool reads the template first: its own copy, then ready)
        name = pool.new()
        with psycopg.connect(with_db(pg_server, name), autocommit=True) as conn:
            conn.execute(change)
        drop = pool.give_back(name, admin)
        assert drop is not None and pool.changed
        assert name not in pool.ready and drop not in pool.ready
