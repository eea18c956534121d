"""pg_dump keeps treadle's data: a database with jobs, their history and workflow runs, dumped and restored
into a new database, has every row back, its sequences past every restored id, and works.

Through pg_tle (make test-pgtle), as docs/operations.md#backups says: the dump carries pg_tle's
registration of treadle; an administrator makes pg_tle in the new database and lets the role
that installed treadle in, and that role restores everything but pg_tle's own entries."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.conftest import INSTALL, NewDatabase
from tests.pgtle_install import prepare_pgtle
from tests.sql.sqlcalls import Connect, value
from tests.sql.test_sql_enqueue_common import guards

BINDIR = Path(subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True, text=True).stdout.strip())

ROWS = {
    "jobs": "select to_jsonb(j) from treadle.jobs as j order by id",
    "workflow_runs": "select to_jsonb(r) from treadle.workflow_runs as r order by id",
    "workflows": "select to_jsonb(w) from treadle.workflows as w order by name",
    "job_history": "select to_jsonb(h) from treadle.job_history as h order by id",
    "history_slots": "select to_jsonb(s) from treadle.history_slots as s order by slot",
}


@pytest.fixture
def restored_url(new_database: NewDatabase) -> str:
    """The URL of an empty database to restore into (dropped afterwards)."""
    return new_database(template=None)


def fill(conn: psycopg.Connection) -> uuid.UUID:
    """Jobs in every state, a periodic series, workflow runs and a definition; returns a live lease token."""
    conn.execute(
        """select treadle.enqueue_many((select jsonb_agg(jsonb_build_object('name', 'bulk',
                                                                      'args', jsonb_build_object('n', g)))
                                          from generate_series(1, 50) as g))"""
    )
    conn.execute("select treadle.enqueue('keyed', idempotency_key => 'invoice-1')")
    conn.execute("select treadle.enqueue('tick', queue => 'cron', every => '1 hour')")
    conn.execute("select treadle.complete(id, lease_token, '{\"ok\": true}') from treadle.claim('w', array['cron'])")
    conn.execute("select treadle.cancel(id) from treadle.jobs where name = 'bulk' and id % 5 = 0")
    conn.execute("select treadle.fail(id, lease_token, 'boom') from treadle.claim('w', batch => 3)")
    conn.execute("select treadle.define_workflow('signup', array['create', 'welcome'])")
    run_id = value(conn, "select treadle.start_workflow('signup', '{\"user\": 1}')")
    conn.execute(
        "select treadle.complete(id, lease_token, '{\"account\": 9}') "
        "from treadle.claim('w', names => array['workflow:signup/create'])"
    )
    conn.execute("select treadle.start_workflow('other', steps => array['x'], idempotency_key => 'run-1')")
    assert conn.execute("select treadle.workflow_results(%s)", (run_id,)).fetchone() == ({"create": {"account": 9}},)
    # two minutes on, the finished jobs without a key or a run move to the history
    conn.execute("select set_config('treadle.now', (now() + interval '2 minutes')::text, false)")
    assert value(conn, "select treadle.archive()") > 0
    conn.execute("select set_config('treadle.now', '', false)")
    row = conn.execute("select lease_token from treadle.claim('w', lease => '1 hour')").fetchone()
    assert row is not None
    token: uuid.UUID = row[0]
    return token


# pg_tle's own entries in a dump, which CREATE EXTENSION pg_tle made in the new database already
PGTLE_ENTRIES = (" SCHEMA - pgtle ", " EXTENSION - pg_tle ", " COMMENT - EXTENSION pg_tle ", " TABLE DATA pgtle ")


def restore(dump: Path, url: str, tmp_path: Path) -> None:
    if INSTALL != "pgtle":
        subprocess.run([str(BINDIR / "pg_restore"), "--exit-on-error", "--dbname", url, str(dump)], check=True)
        return
    owner_url = prepare_pgtle(url)
    listing = subprocess.run(
        [str(BINDIR / "pg_restore"), "--list", str(dump)], check=True, capture_output=True, text=True
    )
    entries = tmp_path / "entries.list"
    entries.write_text(
        "".join(line for line in listing.stdout.splitlines(True) if not any(e in line for e in PGTLE_ENTRIES))
    )
    subprocess.run(
        [str(BINDIR / "pg_restore"), "--exit-on-error", "--use-list", str(entries), "--dbname", owner_url, str(dump)],
        check=True,
    )


@pytest.mark.subprocess
def test_dump_and_restore_keeps_rows_and_sequences(
    connect: Connect, dsn: str, restored_url: str, tmp_path: Path, make_role: Callable[[str], str]
) -> None:
    source = connect()
    live_token = fill(source)
    # what restricts an enqueue (treadle.enqueue_guards, made again by the restore)
    source.execute("select treadle.set_queue('full', max_depth => 1), treadle.enqueue('held', queue => 'full')")
    source.execute("select treadle.set_tenant(%s, 'kept.')", (make_role("restored"),))
    assert len(guards(source)) == 2
    before = {table: source.execute(sql).fetchall() for table, sql in ROWS.items()}
    assert len(before["jobs"]) > 40 and len(before["workflow_runs"]) == 2
    assert len(before["job_history"]) >= 10 and len(before["history_slots"]) >= 1

    dump = tmp_path / "treadle.dump"
    subprocess.run([str(BINDIR / "pg_dump"), "--format=custom", "--file", str(dump), dsn], check=True)
    restore(dump, restored_url, tmp_path)

    with psycopg.connect(restored_url, autocommit=True) as restored:
        after = {table: restored.execute(sql).fetchall() for table, sql in ROWS.items()}
        assert after == before
        assert len(guards(restored)) == 2
        with pytest.raises(psycopg.Error) as full:
            restored.execute("select treadle.enqueue('more', queue => 'full')")
        assert full.value.sqlstate == "TQ001"

        max_job = max(row[0]["id"] for row in before["jobs"] + before["job_history"])
        max_run = max(row[0]["id"] for row in before["workflow_runs"])
        new_job = value(restored, "select treadle.enqueue('after-restore')")
        assert new_job > max_job
        new_runs = restored.execute(
            "select treadle.start_workflow('signup'), "
            "treadle.start_workflow('other', steps => array['x'], idempotency_key => 'run-1')"
        ).fetchone()
        assert new_runs is not None and new_runs[0] > max_run
        assert restored.execute("select id from treadle.workflow_runs where idempotency_key = 'run-1'").fetchone() == (
            new_runs[1],
        )
        assert new_runs[1] <= max_run, "a restored workflow key still returns its run"
        keyed = next(row[0]["id"] for row in before["jobs"] if row[0]["idempotency_key"] == "invoice-1")
        assert restored.execute("select treadle.enqueue('keyed', idempotency_key => 'invoice-1')").fetchone() == (
            keyed,
        )

        # the restored queue works: the job that was running completes with the token it had
        running_id = next(row[0]["id"] for row in before["jobs"] if row[0]["state"] == "running")
        assert restored.execute("select treadle.complete(%s, %s)", (running_id, live_token)).fetchone() == (
            "completed",
        )
        # and the restored run goes on to its end
        step = restored.execute(
            "select workflow_run_id, treadle.complete(id, lease_token, '\"hi\"') "
            "from treadle.claim('w', names => array['workflow:signup/welcome'])"
        ).fetchone()
        assert step is not None and step[1] == "completed"
        assert restored.execute(
            "select state, treadle.workflow_results(id) from treadle.workflow_runs where id = %s", (step[0],)
        ).fetchone() == ("completed", {"create": {"account": 9}, "welcome": "hi"})

        # the restored history is read and emptied by retention like the one dumped
        moved = [row[0]["id"] for row in before["job_history"]]
        assert value(restored, "select count(*) from treadle.job_details where id = any(%s)", (moved,)) == len(moved)
        restored.execute("select set_config('treadle.now', (now() + interval '40 days')::text, false)")
        assert value(restored, "select treadle.apply_retention(100000)") >= len(moved)
        assert value(restored, "select count(*) from treadle.job_history") == 0
        assert value(restored, "select count(*) from treadle.history_slots") == 0


@pytest.mark.subprocess
@pytest.mark.parametrize("disable_triggers", [False, True], ids=["triggers", "disable-triggers"])
def test_a_data_only_restore_keeps_the_enqueue_guards(
    connect: Connect,
    dsn: str,
    new_database: NewDatabase,
    tmp_path: Path,
    make_role: Callable[[str], str],
    disable_triggers: bool,
) -> None:
    """The rows of queues and tenants restored into an installed treadle (pg_restore
    --data-only), with their triggers on or off: the guards are the tables' (none is made
    twice, none is missing), so the tenant stays in its prefix and the max_depth holds."""
    source = connect()
    tenant = make_role("dataonly")
    source.execute("select treadle.grant_producer(%s), treadle.set_tenant(%s, 'kept.')", (tenant, tenant))
    source.execute("select treadle.set_queue('full', max_depth => 1), treadle.set_queue('free', concurrency => 1)")
    assert len(guards(source)) == 2
    dump = tmp_path / "treadle.dump"
    subprocess.run([str(BINDIR / "pg_dump"), "--format=custom", "--file", str(dump), dsn], check=True)

    target = new_database()
    tables = [arg for table in ("queues", "tenants", "enqueue_guards") for arg in ("--table", table)]
    subprocess.run(
        [str(BINDIR / "pg_restore"), "--exit-on-error", "--data-only", "--schema=treadle", *tables]
        + (["--disable-triggers"] if disable_triggers else [])
        + ["--dbname", target, str(dump)],
        check=True,
    )
    with psycopg.connect(target, autocommit=True) as restored:
        assert len(guards(restored)) == 2
        restored.execute("select treadle.enqueue('one', queue => 'full')")
        with pytest.raises(psycopg.Error) as full:
            restored.execute("select treadle.enqueue('two', queue => 'full')")
        assert full.value.sqlstate == "TQ001"
        restored.execute(f'set role "{tenant}"')
        with pytest.raises(psycopg.Error) as outside:
            restored.execute("select treadle.enqueue('n', '{}'::jsonb, queue => 'elsewhere')")
        assert outside.value.sqlstate == "42501"
