"""A claim over job names while a candidate changes under it.

A claim over several names reads its candidates without a lock, then locks them by key: whatever
changed a candidate in between must keep it from the claim, as the single name's locking read does.
Each test parks the claim between its two statements (a transaction holding treadle.jobs in EXCLUSIVE
mode lets the read through, which takes ACCESS SHARE, and stops the lock, which takes ROW SHARE, seen
waiting in pg_locks), changes the candidate in that transaction and commits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.sql.sqlcalls import Connect, WaitBlocked, value

QUEUE = "names-race"


def due_occurrence(conn: psycopg.Connection, schedule: str, job: str) -> int:
    """A cron schedule's waiting occurrence of `job` in QUEUE, made due now."""
    job_id = value(conn, "select treadle.schedule(%s, '0 0 1 1 *', %s, queue => %s)", (schedule, job, QUEUE))
    conn.execute("update treadle.jobs set run_at = treadle.now() - interval '1 minute' where id = %s", (job_id,))
    return int(job_id)


def keyed(conn: psycopg.Connection, job: str) -> int:
    return int(value(conn, "select treadle.enqueue(%s, '{}', queue => %s, idempotency_key => 'k')", (job, QUEUE)))


def plain(conn: psycopg.Connection, job: str) -> int:
    return int(value(conn, "select treadle.enqueue(%s, '{}', queue => %s)", (job, QUEUE)))


def parked_claim(
    connect: Connect, wait_until_blocked: WaitBlocked, names: list[str], batch: int, sql: str, params: dict[str, int]
) -> list[tuple[int, str, str]]:
    """A claim over `names` in QUEUE, parked between its read and its lock while `sql` runs and commits."""
    claimer = connect()
    locker = connect(autocommit=False)
    locker.execute("lock table treadle.jobs in exclusive mode")
    with ThreadPoolExecutor(1) as pool:
        claim = pool.submit(
            lambda: claimer.execute(
                "select id, name, queue from treadle.claim('w', array['names-race'], names => %s, batch => %s)",
                (names, batch),
            ).fetchall()
        )
        wait_until_blocked(claimer.info.backend_pid)
        waits = locker.execute(
            "select relation::regclass::text, mode from pg_locks where pid = %s and not granted",
            (claimer.info.backend_pid,),
        ).fetchall()
        assert waits == [("treadle.jobs", "RowShareLock")], "the claim waits to lock, its read done"
        locker.execute(sql, params)
        locker.commit()
        return claim.result(timeout=60)


# (the candidate made, then what the other transaction does to it while the claim is parked)
CHANGES: dict[str, tuple[Callable[[psycopg.Connection], int], str]] = {
    "renamed by its schedule": (
        lambda c: due_occurrence(c, "race-rename", "a"),
        "select treadle.schedule('race-rename', '0 0 1 1 *', 'c', queue => 'names-race')",
    ),
    "moved to another queue by its schedule": (
        lambda c: due_occurrence(c, "race-move", "a"),
        "select treadle.schedule('race-move', '0 0 1 1 *', 'a', queue => 'names-race-elsewhere')",
    ),
    "cancelled": (lambda c: plain(c, "a"), "select treadle.cancel(%(id)s)"),
    "claimed and completed": (
        lambda c: plain(c, "a"),
        "select treadle.complete(id, lease_token) from treadle.claim('other', array['names-race'], batch => 1)",
    ),
    "replaced to run later": (
        lambda c: keyed(c, "a"),
        """select treadle.enqueue('a', '{}', queue => 'names-race', idempotency_key => 'k',
                                  on_conflict => 'replace', run_at => treadle.now() + interval '1 hour')""",
    ),
}


@pytest.mark.parametrize("names", [["a", "b"], ["a"]], ids=["several names", "one name"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_candidate_changed_before_the_lock_is_not_claimed(
    connect: Connect, wait_until_blocked: WaitBlocked, change: str, names: list[str]
) -> None:
    make, sql = CHANGES[change]
    setup = connect()
    candidate = make(setup)
    other = plain(setup, "b")  # (after the candidate in claim order)
    got = parked_claim(connect, wait_until_blocked, names, 2, sql, {"id": candidate})
    assert candidate not in {r[0] for r in got}, f"{change}: claimed {got}"
    assert got == ([(other, "b", QUEUE)] if "b" in names else [])
    assert all(r[1] in names for r in got)


def test_a_claim_over_names_takes_the_best_due_rows_past_held_ones_in_claim_order(connect: Connect) -> None:
    """Jobs of five names at mixed priorities and run_at, jobs of a name not asked for and jobs not
    yet due: claims over the names (one held open, the last over 1,000 names with duplicates and
    names that hold nothing, its batch beyond the rows) take exactly the best due rows nobody
    holds, lowest priority, then run_at, then id, as one name's claim would."""
    setup = connect()
    rng = random.Random(23)
    for i in range(80):
        setup.execute(
            "select treadle.enqueue(%s, '{}', queue => 'names-order', priority => %s,"
            " run_at => treadle.now() + make_interval(secs => %s))",
            (f"n{rng.randrange(5)}" if i % 8 else "other", rng.randrange(4) - 1, -rng.randrange(4) if i % 9 else 60),
        )
    unheld = """select id from treadle.jobs
                 where queue = 'names-order' and name = any (%s)
                   and state = any (array['available', 'retryable']) and run_at <= treadle.now()
                 order by priority, run_at, id for update skip locked"""
    claim = "select id from treadle.claim(%s, array['names-order'], names => %s, batch => %s)"
    holder = connect(autocommit=False)
    expected = [r[0] for r in setup.execute(unheld, (["n1", "n3"],)).fetchall()][:7]
    assert [r[0] for r in holder.execute(claim, ("h", ["n3", "n1"], 7)).fetchall()] == expected
    names = ["n0", "n1", "n2", "n3", "n4"]
    second = connect(autocommit=False)
    expected = [r[0] for r in setup.execute(unheld, (names,)).fetchall()][:5]
    assert [r[0] for r in second.execute(claim, ("s", names, 5)).fetchall()] == expected
    many = ["n4", "n2", "n4", *[f"absent-{i}" for i in range(992)], "n0", "n3", "n1", "n0", "absent-1"]
    assert len(many) == 1000
    expected = [r[0] for r in setup.execute(unheld, (names,)).fetchall()]
    assert len(expected) > 20
    assert [r[0] for r in connect().execute(claim, ("m", many, 1000)).fetchall()] == expected
    holder.commit()
    second.commit()


@pytest.mark.parametrize("names", [["a", "b"], ["b", "a"]])
def test_a_candidate_moved_behind_another_before_the_lock_is_not_claimed_first(
    connect: Connect, wait_until_blocked: WaitBlocked, names: list[str]
) -> None:
    """The best candidate's priority made worse than the next job's between the read and the lock:
    a claim of one takes the job now best, not the one read first."""
    setup = connect()
    moved = due_occurrence(setup, "race-priority", "a")
    best = int(value(setup, "select treadle.enqueue('b', '{}', queue => 'names-race', priority => 5)"))
    got = parked_claim(
        connect,
        wait_until_blocked,
        names,
        1,
        "select treadle.schedule('race-priority', '0 0 1 1 *', 'a', queue => 'names-race', priority => 10)",
        {},
    )
    assert [r[0] for r in got] == [best], f"{moved} read first, moved to priority 10"


def test_a_claim_over_names_past_many_held_rows_locks_only_what_it_takes(connect: Connect) -> None:
    """300 rows over two names held by an open claim: a claim of 3 over the names reads on past
    them (ever more candidates at a time) and locks the 3 next in claim order, and no other row."""
    setup = connect()
    ids = [
        r[0]
        for r in setup.execute(
            """select t.id from treadle.enqueue_many((select jsonb_agg(jsonb_build_object(
                   'name', case when g % 3 = 0 then 'x' else 'y' end, 'queue', 'names-many-held'))
                 from generate_series(1, 400) as g)) as t(id)"""
        ).fetchall()
    ]
    claim = "select id from treadle.claim(%s, array['names-many-held'], names => array['x', 'y'], batch => %s)"
    holder = connect(autocommit=False)
    assert [r[0] for r in holder.execute(claim, ("h", 300)).fetchall()] == ids[:300]
    other = connect(autocommit=False)
    assert [r[0] for r in other.execute(claim, ("o", 3)).fetchall()] == ids[300:303]
    free = setup.execute(
        "select id from treadle.jobs where queue = 'names-many-held' and state = 'available' for update skip locked"
    ).fetchall()
    assert sorted(r[0] for r in free) == ids[303:], "the claim locked only what it took"
    holder.commit()
    other.commit()


@pytest.mark.parametrize("names", [["a", "b"], ["a"]], ids=["several names", "one name"])
@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_a_snapshot_claim_over_names_skips_held_rows_and_fails_on_rows_claimed_since(
    connect: Connect, names: list[str], isolation: str
) -> None:
    """A claim in a REPEATABLE READ or SERIALIZABLE transaction: a row another open claim holds is
    skipped for the next; a row another claim took and committed after the snapshot raises 40001,
    over several names as over one, and the claim takes nothing."""
    setup = connect()
    first, second = plain(setup, "a"), plain(setup, "a")
    claim = "select id from treadle.claim(%s, array['names-race'], names => %s, batch => 1)"
    holder = connect(autocommit=False)
    assert holder.execute(claim, ("h", ["a"])).fetchall() == [(first,)]
    snap = connect(autocommit=False)
    snap.execute(f"set transaction isolation level {isolation}")
    snap.execute("select count(*) from treadle.jobs").fetchall()  # (the snapshot taken)
    assert snap.execute(claim, ("s", names)).fetchall() == [(second,)]
    snap.rollback()
    snap.execute(f"set transaction isolation level {isolation}")
    snap.execute("select count(*) from treadle.jobs").fetchall()
    holder.commit()  # (first taken and committed after the snapshot)
    with pytest.raises(psycopg.errors.SerializationFailure):
        snap.execute(claim, ("s", names))
    snap.rollback()
    assert value(setup, "select state from treadle.jobs where id = %s", (second,)) == "available"
