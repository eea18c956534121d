"""The catalog snapshot that the upgrade and install tests compare sees every kind of change
those tests rely on it to see, and nothing else (two fresh installs compare equal)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.catalog import describe_difference, snapshot
from tests.conftest import NewDatabase

# (a change made to one of two fresh installs, a line the difference must show)
CHANGES = [
    ("GRANT EXECUTE ON FUNCTION treadle.version() TO public", "PUBLIC: EXECUTE by <owner>"),
    ("ALTER FUNCTION treadle.rescue() SET work_mem = '8MB'", "work_mem=8MB"),
    ("ALTER FUNCTION treadle.version() SECURITY DEFINER", "+security definer: true"),
    ("ALTER FUNCTION treadle.prune(interval) COST 7", "cost: 7"),
    (
        (
            "CREATE OR REPLACE FUNCTION treadle.workflow_results(run_id bigint) RETURNS jsonb LANGUAGE sql STABLE"
            " RETURN '{}'::jsonb"
        ),
        "RETURN '{}'::jsonb",
    ),
    ("COMMENT ON FUNCTION treadle.cancel(bigint, text) IS 'changed'", "comment: changed"),
    ("ALTER TABLE treadle.jobs ADD COLUMN extra integer", "+column extra integer"),
    ("ALTER TABLE treadle.jobs ALTER COLUMN priority SET DEFAULT 5", "+column priority integer not null default 5"),
    ("ALTER TABLE treadle.workers ALTER COLUMN host DROP NOT NULL", "-column host text not null"),
    ("GRANT SELECT (id) ON treadle.jobs TO public", "grants PUBLIC: SELECT by <owner>"),
    ("ALTER TABLE treadle.jobs DROP CONSTRAINT jobs_step_check", "jobs.jobs_step_check: only in fresh"),
    ("CREATE INDEX jobs_extra_idx ON treadle.jobs (created_at)", "jobs_extra_idx"),
    ("ALTER SEQUENCE treadle.jobs_id_seq CACHE 10", "cache 10"),
    ("ALTER VIEW treadle.job_details SET (security_barrier = true)", "security_barrier=true"),
    ("ALTER TABLE treadle.history_slots ENABLE ROW LEVEL SECURITY", "row level security: true"),
    ("CREATE POLICY only_mine ON treadle.workflows USING (name = current_user)", "workflows.only_mine"),
    ("ALTER STATISTICS treadle.jobs_queue_state_stats SET STATISTICS 50", "target: 50"),
    (
        (
            "CREATE FUNCTION treadle.t() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';"
            " CREATE TRIGGER t BEFORE INSERT ON treadle.workers FOR EACH ROW EXECUTE FUNCTION treadle.t()"
        ),
        "workers.t",
    ),
    ("CREATE TYPE treadle.mood AS ENUM ('calm')", "labels: calm"),
    # (pg_extension_config_dump runs only inside an extension script: the catalog is edited directly)
    (
        "UPDATE pg_catalog.pg_extension SET extcondition[1] = 'WHERE false' WHERE extname = 'treadle'",
        "condition: WHERE false",
    ),
    ("ALTER EXTENSION treadle DROP FUNCTION treadle.version()", "not a member"),
    ("GRANT USAGE ON SCHEMA treadle TO public", "PUBLIC: USAGE by <owner>"),
]


@pytest.fixture(scope="module")
def two_fresh_installs(new_module_database: NewDatabase) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
    with (
        psycopg.connect(new_module_database(None), autocommit=True) as conn_a,
        psycopg.connect(new_module_database(None), autocommit=True) as conn_b,
    ):
        for conn in (conn_a, conn_b):
            conn.execute("CREATE EXTENSION treadle")
        yield conn_a, conn_b


def test_two_fresh_installs_are_equal(two_fresh_installs: tuple[psycopg.Connection, psycopg.Connection]) -> None:
    a, b = two_fresh_installs
    taken = snapshot(a)
    assert taken["functions"] and taken["relations"] and taken["indexes"] and taken["extension config"]
    assert describe_difference(taken, snapshot(b), "fresh", "also fresh") == ""


def test_every_kind_of_change_shows(two_fresh_installs: tuple[psycopg.Connection, psycopg.Connection]) -> None:
    fresh, changed = two_fresh_installs
    for statement, _ in CHANGES:
        changed.execute(statement)
    difference = describe_difference(snapshot(fresh), snapshot(changed), "fresh", "changed")
    missing = [statement for statement, shown in CHANGES if shown not in difference]
    assert not missing, f"the snapshot missed these changes: {missing}\n{difference}"
