"""A claim over job names while a candidate changes under it.

A claim over several names reads its candidates without a lock, then locks them by key: whatever
changed a candidate in between must keep it from the claim, as the single name's locking read does.
Each test parks the claim between its two statements (a transaction holding treadle.jobs in EXCLUSIVE
mode lets the read through, which takes ACCESS SHARE, and stops the lock, which takes ROW SHARE, seen
waiting in pg_locks), changes the candidate in that transaction and commits.
"""

from __future__ import annotations

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
    claimer = connect()
    locker = connect(autocommit=False)
    locker.execute("lock table treadle.jobs in exclusive mode")
    with ThreadPoolExecutor(1) as pool:
        claim = pool.submit(
            lambda: claimer.execute(
                "select id, name, queue from treadle.claim('w', array['names-race'], names => %s, batch => 2)",
                (names,),
            ).fetchall()
        )
        wait_until_blocked(claimer.info.backend_pid)
        waits = setup.execute(
            "select relation::regclass::text, mode from pg_locks where pid = %s and not granted",
            (claimer.info.backend_pid,),
        ).fetchall()
        assert waits == [("treadle.jobs", "RowShareLock")], "the claim waits to lock, its read done"
        locker.execute(sql, {"id": candidate})
        locker.commit()
        got = claim.result(timeout=60)
    assert candidate not in {r[0] for r in got}, f"{change}: claimed {got}"
    assert got == ([(other, "b", QUEUE)] if "b" in names else [])
    assert all(r[1] in names for r in got)
