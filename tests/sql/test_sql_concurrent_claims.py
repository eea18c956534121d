"""Several connections claim from one backlog at once: every job is claimed exactly once."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg

from tests.sql.sqlcalls import Connect

BACKLOG = 2000
CLAIMERS = 8


def fill_backlog(conn: psycopg.Connection, queue: str, count: int) -> set[int]:
    rows = conn.execute(
        """select t.id from treadle.enqueue_many(
               (select jsonb_agg(jsonb_build_object('name', 'work', 'queue', %s::text, 'args',
                                                    jsonb_build_object('n', g), 'priority', g %% 7))
                  from generate_series(1, %s) as g)) as t(id)""",
        (queue, count),
    ).fetchall()
    return {r[0] for r in rows}


def claim_until_empty(
    conn: psycopg.Connection, worker: str, queue: str, batch: int, start: threading.Barrier
) -> list[tuple[int, uuid.UUID, int]]:
    """Claim batches and finish each one with complete_many, until nothing is left."""
    start.wait()
    claimed: list[tuple[int, uuid.UUID, int]] = []
    while True:
        rows = conn.execute(
            "select id, lease_token, attempt from treadle.claim(%s, array[%s], batch => %s)",
            (worker, queue, batch),
        ).fetchall()
        if not rows:
            return claimed
        claimed.extend(rows)
        states = conn.execute(
            "select state from treadle.complete_many(%s, %s)",
            ([r[0] for r in rows], [r[1] for r in rows]),
        ).fetchall()
        assert states == [("completed",)] * len(rows)


def test_every_job_of_a_backlog_is_claimed_once(connect: Connect) -> None:
    setup = connect()
    ids = fill_backlog(setup, "backlog", BACKLOG)
    assert len(ids) == BACKLOG
    conns = [connect() for _ in range(CLAIMERS)]
    start = threading.Barrier(CLAIMERS)

    with ThreadPoolExecutor(CLAIMERS) as pool:
        results = list(
            pool.map(
                lambda i: claim_until_empty(conns[i], f"w{i}", "backlog", 10 + i * 5, start),
                range(CLAIMERS),
            )
        )

    claims = Counter(job_id for result in results for job_id, _, _ in result)
    assert set(claims) == ids
    assert max(claims.values()) == 1
    assert {attempt for result in results for _, _, attempt in result} == {1}
    assert sum(1 for result in results if result) > 1, "the backlog was shared by several claimers"
    states = setup.execute("select state, count(*) from treadle.jobs group by state").fetchall()
    assert states == [("completed", BACKLOG)]


def test_concurrent_claimers_get_disjoint_batches_in_open_transactions(connect: Connect) -> None:
    """Claims held in open transactions are skipped, not waited for, and never shared."""
    setup = connect()
    ids = fill_backlog(setup, "held", 60)
    holders = [connect(autocommit=False) for _ in range(3)]
    held: list[set[int]] = []
    for i, conn in enumerate(holders):
        rows = conn.execute("select id from treadle.claim(%s, array['held'], batch => 20)", (f"h{i}",)).fetchall()
        held.append({r[0] for r in rows})
    for conn in holders:
        conn.commit()
    assert [len(h) for h in held] == [20, 20, 20]
    assert held[0] | held[1] | held[2] == ids
    assert not (held[0] & held[1]) and not (held[1] & held[2]) and not (held[0] & held[2])


def test_a_rolled_back_claim_leaves_the_job_claimable(connect: Connect) -> None:
    setup = connect()
    (job_id,) = fill_backlog(setup, "undo", 1)
    claimer = connect(autocommit=False)
    assert claimer.execute("select id from treadle.claim('w', array['undo'])").fetchall() == [(job_id,)]
    claimer.rollback()
    row = setup.execute("select id, attempt from treadle.claim('w2', array['undo'])").fetchone()
    assert row == (job_id, 1)


def test_claimers_over_many_queues_take_every_job_once(connect: Connect) -> None:
    """Claimers naming the same 40 queues contend for their heads: no job is lost or taken twice."""
    setup = connect()
    queues = [f"contended-{i}" for i in range(40)]
    ids: set[int] = set()
    for queue in queues:
        ids |= fill_backlog(setup, queue, 25)
    conns = [connect() for _ in range(4)]
    start = threading.Barrier(4)

    def claim_all(i: int) -> list[int]:
        start.wait()
        got: list[int] = []
        claim = "select id, lease_token from treadle.claim(%s, %s, batch => %s)"
        while rows := conns[i].execute(claim, (f"w{i}", queues, 3 + i)).fetchall():
            got.extend(r[0] for r in rows)
            conns[i].execute("select treadle.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
        return got

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(claim_all, range(4)))
    claims = Counter(job_id for result in results for job_id in result)
    assert set(claims) == ids
    assert max(claims.values()) == 1


def test_a_claim_over_many_queues_locks_only_what_it_takes(connect: Connect) -> None:
    """A claim of one job over 30 queues, held open, leaves every other queue's jobs free:
    a raw SKIP LOCKED read of them from another session sees them all."""
    setup = connect()
    queues = [f"locks-{i}" for i in range(30)]
    ids: set[int] = set()
    for queue in queues:
        ids |= fill_backlog(setup, queue, 2)
    holder = connect(autocommit=False)
    taken = holder.execute("select id, queue from treadle.claim('h', %s, batch => 1)", (queues,)).fetchall()
    assert len(taken) == 1
    free = setup.execute(
        """select id from treadle.jobs
            where queue = any(%s) and state = 'available'
              for update skip locked""",
        (queues,),
    ).fetchall()
    assert {r[0] for r in free} == ids - {taken[0][0]}
    holder.commit()


def named_jobs(conn: psycopg.Connection, queue: str, names: list[str], each: int) -> list[int]:
    """`each` jobs of every name, the names interleaved: ids in claim order (one priority, run_at now)."""
    return [
        conn.execute("select treadle.enqueue(%s, '{}', queue => %s)", (name, queue)).fetchone()[0]  # type: ignore[index]
        for _ in range(each)
        for name in names
    ]


def test_a_claim_over_several_names_locks_only_what_it_takes(connect: Connect) -> None:
    """A claim of 4 over three names, held open, locks its 4 jobs and no other: a name read
    first that holds fewer than the batch does not make the next name's read lock a batch more."""
    setup = connect()
    ids = named_jobs(setup, "names-locks", ["b", "c"], 5) + named_jobs(setup, "names-locks", ["a"], 3)
    holder = connect(autocommit=False)
    taken = holder.execute(
        "select id from treadle.claim('h', array['names-locks'], names => array['a', 'b', 'c'], batch => 4)"
    ).fetchall()
    assert [r[0] for r in taken] == ids[:4]
    free = setup.execute(
        "select id from treadle.jobs where queue = 'names-locks' and state = 'available' for update skip locked"
    ).fetchall()
    assert {r[0] for r in free} == set(ids[4:])
    holder.commit()


def test_a_claim_over_several_names_fills_its_batch_past_rows_another_claim_holds(connect: Connect) -> None:
    """The best rows over the names are held by an open claim: another claim over the same names
    skips them and still takes a whole batch, the next best in claim order."""
    setup = connect()
    ids = named_jobs(setup, "names-held", ["x", "y"], 6)
    holder = connect(autocommit=False)
    held = holder.execute(
        "select id from treadle.claim('h', array['names-held'], names => array['x', 'y'], batch => 3)"
    ).fetchall()
    assert [r[0] for r in held] == ids[:3]
    other = connect(autocommit=False)
    got = other.execute(
        "select id from treadle.claim('o', array['names-held'], names => array['y', 'x'], batch => 5)"
    ).fetchall()
    assert [r[0] for r in got] == ids[3:8]
    free = setup.execute(
        "select id from treadle.jobs where queue = 'names-held' and state = 'available' for update skip locked"
    ).fetchall()
    assert {r[0] for r in free} == set(ids[8:]), "the other claim locked only what it took"
    holder.commit()
    other.commit()


def test_claimers_over_several_names_take_every_job_once(connect: Connect) -> None:
    """Claimers naming the same three names (and one name nobody enqueues) contend for their heads:
    no job is lost or taken twice."""
    setup = connect()
    ids = set(named_jobs(setup, "names-contended", ["n1", "n2", "n3"], 150))
    conns = [connect() for _ in range(4)]
    start = threading.Barrier(4)

    def claim_all(i: int) -> list[int]:
        start.wait()
        got: list[int] = []
        claim = "select id, lease_token from treadle.claim(%s, array['names-contended'], names => %s, batch => %s)"
        names = ["n1", "n2", "n3", "none"][i % 4 :] + ["n1", "n2", "n3", "none"][: i % 4]
        while rows := conns[i].execute(claim, (f"w{i}", names, 3 + 2 * i)).fetchall():
            got.extend(r[0] for r in rows)
            conns[i].execute("select treadle.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
        return got

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(claim_all, range(4)))
    claims = Counter(job_id for result in results for job_id in result)
    assert set(claims) == ids
    assert max(claims.values()) == 1
