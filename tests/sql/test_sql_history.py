"""treadle.job_history across sessions: archivers at once move each job once, retention
never waits on a reader that holds a partition (and empties it on a later call), so
no reader of the history queues behind it,
claims and completes go on while a partition is emptied, and a tenant reads only its
queues' history."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout

import psycopg

from tests.conftest import as_role
from tests.sql.sqlcalls import Connect, value
from tests.sql.test_sql_retention import completed_jobs

# Two minutes after the jobs finished: archive moves jobs finished over a minute ago.
LATER = "select set_config('treadle.now', (now() + interval '2 minutes')::text, false)"
# Eight days after: their history partition's day (7 days of retention) has ended.
MUCH_LATER = "select set_config('treadle.now', (now() + interval '8 days')::text, false)"


def history(conn: psycopg.Connection, ids: list[int]) -> list[int]:
    return [r[0] for r in conn.execute("select id from treadle.job_history where id = any(%s) order by id", (ids,))]


def test_archivers_at_once_move_each_job_once(connect: Connect) -> None:
    ids = completed_jobs(connect(), 300)
    sessions = [connect(autocommit=False) for _ in range(4)]
    for session in sessions:
        session.execute(LATER)
        session.commit()

    def archive_all(session: psycopg.Connection) -> int:
        moved = 0
        while True:
            batch = int(value(session, "select treadle.archive(25)"))
            session.commit()
            moved += batch
            if batch == 0:
                return moved

    with ThreadPoolExecutor(len(sessions)) as pool:
        moved = sum(pool.map(archive_all, sessions))
    check = connect()
    assert moved == len(ids), "every job counted once, by the session that moved it"
    assert history(check, ids) == ids
    assert value(check, "select count(*) from treadle.jobs where id = any(%s)", (ids,)) == 0


def test_a_first_archiver_holding_rows_does_not_stop_a_second(connect: Connect) -> None:
    ids = completed_jobs(connect(), 10)
    first, second = connect(autocommit=False), connect()
    for session in (first, second):
        session.execute(LATER)
    second.execute("set lock_timeout = '2s'")
    assert value(first, "select treadle.archive(4)") == 4
    assert value(second, "select treadle.archive()") == 6, "the second skips the rows the first holds"
    first.commit()
    assert history(second, ids) == ids


def test_retention_does_not_wait_on_a_reader_and_empties_the_partition_later(connect: Connect) -> None:
    setup = connect()
    ids = completed_jobs(setup, 20)
    setup.execute(LATER)
    assert value(setup, "select treadle.archive()") == 20

    reader = connect(autocommit=False)
    reader.execute("set transaction isolation level repeatable read")
    assert value(reader, "select count(*) from treadle.job_details where id = any(%s)", (ids,)) == 20

    keeper = connect()
    keeper.execute(MUCH_LATER)
    assert value(keeper, "select treadle.apply_retention()") == 0, "the partition a reader holds waits"
    assert value(keeper, "select count(*) from treadle.history_slots") == 1
    # work goes on meanwhile
    worker = connect()
    worker.execute(MUCH_LATER)
    job = value(worker, "select treadle.enqueue('x', queue => 'live')")
    claimed = worker.execute("select id, lease_token from treadle.claim('w', array['live'])").fetchone()
    assert claimed is not None and claimed[0] == job
    assert value(worker, "select treadle.complete(%s, %s)", claimed) == "completed"

    reader.commit()
    assert value(keeper, "select treadle.apply_retention()") == 20, "the next call empties it"
    assert history(keeper, ids) == []
    assert value(keeper, "select count(*) from treadle.history_slots") == 0


def test_retention_gives_way_at_once_and_leaves_no_reader_waiting(
    connect: Connect, dsn: str, make_role: Callable[[str], str]
) -> None:
    """A reader's open transaction holds the history partitions: retention gives up on
    them at once (no lock wait) and so leaves no ACCESS EXCLUSIVE request pending that
    retry, job_details and the others would queue behind, even while its own
    transaction stays open."""
    setup = connect()
    ids = completed_jobs(setup, 20)
    setup.execute(LATER)
    assert value(setup, "select treadle.archive()") == 20
    reader_role, admin_role = make_role("history_reader"), make_role("history_admin")
    setup.execute("select treadle.grant_reader(%s), treadle.grant_admin(%s)", (reader_role, admin_role))

    reader = psycopg.connect(as_role(dsn, reader_role), autocommit=False)
    admin = psycopg.connect(as_role(dsn, admin_role), autocommit=True)
    try:
        assert value(reader, "select count(*) from treadle.job_details where id = any(%s)", (ids,)) == 20
        keeper = connect(autocommit=False)  # a worker's housekeeping, its transaction left open
        keeper.execute(MUCH_LATER)
        admin.execute("set statement_timeout = '500ms'")

        def retention() -> int:
            return int(value(keeper, "select treadle.apply_retention()"))

        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(retention)
            time.sleep(0.1)  # were retention to wait for the lock, it would be waiting now
            # each reads the history: none may queue behind a pending lock request
            assert value(admin, "select treadle.retry(%s)", (ids[0],)) is False
            assert value(admin, "select count(*) from treadle.job_details where id = any(%s)", (ids,)) == 20
            # a wait for the reader's lock would last until the reader commits, below: it returns first
            # (a bound on its time failed on a loaded machine: 0.34 s against 0.25)
            try:
                deleted = pending.result(timeout=30)
            except FuturesTimeout:
                reader.commit()  # (the waiting retention then returns, and the pool with it)
                raise AssertionError("retention waits for the reader's lock") from None
        assert deleted == 0, "the partition the reader holds is left for a later call"
        assert value(admin, "select count(*) from treadle.job_details where id = any(%s)", (ids,)) == 20
        keeper.commit()
        reader.commit()
        assert value(keeper, "select treadle.apply_retention()") == 20, "the next call empties it"
        keeper.commit()
    finally:
        reader.close()
        admin.close()


def test_archive_waits_for_nothing_a_retention_holds(connect: Connect) -> None:
    """A partition being emptied is one whose day has ended: archive never writes there,
    so archiving goes on while a slow retention holds its lock."""
    setup = connect()
    old = completed_jobs(setup, 5, queue="old")
    setup.execute(LATER)
    assert value(setup, "select treadle.archive()") == 5
    keeper = connect(autocommit=False)
    keeper.execute(MUCH_LATER)
    assert value(keeper, "select treadle.apply_retention()") == 5  # holds the emptied partition until commit

    archiver = connect()  # on the keeper's clock: its jobs finish a week after the old ones
    archiver.execute("set lock_timeout = '2s'")
    archiver.execute(MUCH_LATER)
    fresh = completed_jobs(archiver, 5, queue="fresh")
    archiver.execute(MUCH_LATER.replace("8 days", "8 days 2 minutes"))
    assert value(archiver, "select treadle.archive()") == 5
    keeper.commit()
    assert history(archiver, old + fresh) == fresh


def test_a_tenant_reads_only_its_queues_history(connect: Connect, dsn: str, make_role: Callable[[str], str]) -> None:
    setup = connect()
    mine = completed_jobs(setup, 3, queue="mine-mail")
    theirs = completed_jobs(setup, 3, queue="theirs-mail")
    setup.execute(LATER)
    assert value(setup, "select treadle.archive()") == 6
    tenant = make_role("history_tenant")
    setup.execute("select treadle.grant_reader(%s), treadle.set_tenant(%s, 'mine')", (tenant, tenant))

    with psycopg.connect(as_role(dsn, tenant), autocommit=True) as conn:
        seen = [r[0] for r in conn.execute("select id from treadle.job_history order by id")]
        assert seen == mine
        assert [r[0] for r in conn.execute("select id from treadle.job_details order by id")] == mine
        assert value(conn, "select count(*) from treadle.job_details where id = any(%s)", (theirs,)) == 0
        # nobody but the owner reads a partition directly, or the lease tokens, or writes
        for statement in (
            "select * from treadle.job_history_01",
            "select lease_token from treadle.job_history",
            "delete from treadle.job_history",
            "insert into treadle.history_slots values (1, now(), now() + interval '1 day')",
        ):
            try:
                conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                continue
            raise AssertionError(f"{statement} was allowed")
