"""Claims resume from a per-session cursor (sql/src/040_claim.sql): what it must never hide.

Each claimer session keeps, per lane (queue[, name], priority), the key below which it
found nothing left, and the snapshot of its previous claim; rows made claimable by
transactions that snapshot did not see are looked up by ready_txid. These tests put jobs
where a cursor would miss them (late commits, past run_at, better priorities, jobs
that come due, rolled-back claims, a tampered cursor) and check that they are claimed,
once, by the session that holds the cursor; and that many claimers and producers at
once, with a snapshot held open, claim every job exactly once.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.sql.sqlcalls import Connect, claim_plainly, value

CURSOR_NAME = "select treadle._claim_setting(%s::text[], %s::text[])"


# A cursor taken now by the session's clock that saw no transaction: the next claim
# finds each lane among the rows made claimable since (all of them).
BLIND_CURSOR = "format('(1,%%1$s,%%1$s,f,0,{},{},{},{},{},{})', treadle._us(treadle.now()))"


def start_cursor(conn: psycopg.Connection, queues: list[str]) -> None:
    """Put this session's claims from `queues` in cursor mode, as slow claims would (a
    session switches to a cursor only when its claims get slow): it resumes from the
    cursor each claim leaves until its next sweep, 60 s later by the session's clock,
    which ends the cursor when it is quick. Set treadle.now before, if at all."""
    conn.execute(f"select set_config(({CURSOR_NAME}), {BLIND_CURSOR}, false)", (queues, None))


def cursor_of(conn: psycopg.Connection, name: str) -> tuple[object, ...] | None:
    """The session's cursor of that setting name, as a row; None when it has none."""
    row = conn.execute(
        "select (c).* from (select current_setting(%s)::treadle._claim_cursor as c) as s"
        " where current_setting(%s) like '(%%'",
        (name, name),
    ).fetchone()
    return None if row is None else tuple(row)


def enqueue(conn: psycopg.Connection, queue: str, **options: object) -> int:
    columns = ", ".join(f"{k} => %({k})s" for k in options)
    sql = f"select treadle.enqueue('work', queue => %(queue)s{', ' if columns else ''}{columns})"
    return int(value(conn, sql, {"queue": queue, **options}))  # type: ignore[arg-type]


def claim(conn: psycopg.Connection, queue: str, batch: int = 1, worker: str = "w") -> list[int]:
    rows = conn.execute("select id from treadle.claim(%s, array[%s], batch => %s)", (worker, queue, batch))
    return [r[0] for r in rows.fetchall()]


def drain(conn: psycopg.Connection, queue: str) -> list[int]:
    """Claim and complete until a claim comes back empty; the ids in claim order."""
    got: list[int] = []
    while True:
        rows = conn.execute(
            "select id, lease_token from treadle.claim('w', array[%s], batch => 10)", (queue,)
        ).fetchall()
        if not rows:
            return got
        got.extend(r[0] for r in rows)
        conn.execute("select treadle.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))


def test_a_job_committed_late_below_the_cursor_is_claimed(connect: Connect) -> None:
    claimer, producer, other = connect(), connect(autocommit=False), connect()
    start_cursor(claimer, ["late"])
    enqueue(other, "late")
    assert len(claim(claimer, "late")) == 1  # the session has a cursor now
    late = enqueue(producer, "late")  # run_at: now, before the jobs below; not committed yet
    time.sleep(0.01)
    after = [enqueue(other, "late") for _ in range(3)]
    assert claim(claimer, "late", batch=3) == after  # the cursor moves past the late job's key
    assert claim(claimer, "late") == []
    producer.commit()
    assert claim(claimer, "late", batch=5) == [late]


def test_a_late_commit_is_claimed_while_an_old_snapshot_is_held(connect: Connect) -> None:
    claimer, producer, other, holder = connect(), connect(autocommit=False), connect(), connect(autocommit=False)
    holder.execute("set transaction isolation level repeatable read")
    holder.execute("select count(*) from treadle.workflows").fetchall()  # the snapshot stays
    start_cursor(claimer, ["held"])
    for _ in range(200):
        enqueue(other, "held")
    assert len(drain(claimer, "held")) == 200  # 200 dead entries the holder keeps
    late = enqueue(producer, "held")
    mid = [enqueue(other, "held") for _ in range(5)]
    assert drain(claimer, "held") == mid
    producer.commit()
    assert drain(claimer, "held") == [late]
    holder.rollback()


def test_a_limited_queue_leaves_nothing_below_a_cursor(connect: Connect) -> None:
    """A queue's room can leave locked candidates unclaimed: a cursor would count them as
    taken, so a claim that names a limited queue reads from the front even in a session
    that has a cursor for those queues."""
    claimer, owner = connect(), connect()
    # a claim that names a limited queue keys its cursor by the queues with room, sorted
    start_cursor(claimer, ["free", "limited"])
    owner.execute("select treadle.set_queue('limited', concurrency => 1)")
    limited = [enqueue(owner, "limited") for _ in range(3)]
    free = [enqueue(owner, "free") for _ in range(3)]
    both = "select id, lease_token from treadle.claim('w', array['limited', 'free'], batch => 3)"
    first = claimer.execute(both).fetchall()
    # the room of one; the claim goes on to the next queue for the rest
    assert [r[0] for r in first] == [limited[0], *free[:2]]
    claimer.execute("select treadle.complete(%s, %s)", first[0])
    assert [r[0] for r in claimer.execute(both).fetchall()] == [limited[1], free[2]]


@pytest.mark.parametrize("names", [None, ["work"], ["work", "other"]])
def test_a_cursor_goes_round_the_queues_by_turn_as_the_plain_claim_does(
    connect: Connect, names: list[str] | None
) -> None:
    """One tenant's backlog, older and of a better priority, never keeps the other
    tenants' queues waiting, whether the session claims plainly or from a cursor (as
    it does while a long transaction makes its claims slow): each claim starts at the
    session's turn and the next starts after the last queue taken from."""
    claimer, producer = connect(), connect()
    queues = ["fair-flood", "fair-b", "fair-c"]
    by_id: dict[int, str] = {}
    for _ in range(30):
        by_id[enqueue(producer, "fair-flood", priority=-10, run_at="2000-01-01 00:00:00+00")] = "fair-flood"
    setting = value(claimer, CURSOR_NAME, (queues, names))

    def take(batch: int, cursor: bool) -> list[str]:
        if not cursor:
            claim_plainly(claimer, queues, names)
        rows = claimer.execute(
            "select id from treadle.claim('w', %s, %s, batch => %s)", (queues, names, batch)
        ).fetchall()
        if cursor:
            kept = cursor_of(claimer, setting)
            assert kept is not None and kept[3] is False, "the claim went on from its cursor"
        return [by_id[r[0]] for r in rows]

    for cursor in (False, True):
        for queue in queues[1:]:
            for _ in range(3):
                by_id[enqueue(producer, queue)] = queue
        claimer.execute("select set_config('treadle.claim_turn', '0', false)")
        if cursor:
            claimer.execute(f"select set_config(%s, {BLIND_CURSOR}, false)", (setting,))
        assert [q for _ in range(4) for q in take(1, cursor)] == [*queues, "fair-flood"]
        # a batch is taken from the queue in turn, and the rest from the next
        assert take(2, cursor) == ["fair-b", "fair-b"]
        assert take(3, cursor) == ["fair-c", "fair-c", "fair-flood"]
    # each round took 3 of the flood's 30 and every job of the other queues
    assert value(producer, "select count(*) from treadle.jobs where queue = 'fair-flood' and state = 'available'") == 24
    assert value(producer, "select count(*) from treadle.jobs where queue <> 'fair-flood' and state = 'available'") == 0


def test_complete_and_claim_from_a_cursor_takes_the_step_its_own_finish_wrote(connect: Connect) -> None:
    """complete_and_claim writes the next step and claims in one statement, whose snapshot
    may be older than the transaction's id: the step's ready_txid then lies past it. A claim
    from a cursor still takes the step, as a plain claim does, when the claimer names the
    steps (as a worker does: each name its own lane, which only that look-up finds); it left
    it to the session's next claim, which in a worker's chain of steps never came (the step
    then waited for the cursor's sweep, a minute)."""
    producer, worker = connect(), connect()
    producer.execute("select treadle.start_workflow('own', steps => array['a', 'b', 'c'], queue => 'own-steps')")
    queues, names = ["own-steps"], [f"workflow:own/{step}" for step in "abc"]
    setting = value(worker, CURSOR_NAME, (queues, names))
    worker.execute(f"select set_config(%s, {BLIND_CURSOR}, false)", (setting,))
    rows = worker.execute("select id, lease_token from treadle.claim('w', %s, %s)", (queues, names)).fetchall()
    assert len(rows) == 1
    for step in ("b", "c"):
        got = worker.execute(
            "select finished_state, (job).step, (job).id, (job).lease_token"
            " from treadle.complete_and_claim(%s, %s, null, 'w', %s, %s)",
            ([rows[0][0]], [rows[0][1]], queues, names),
        ).fetchall()
        assert [g[:2] for g in got] == [("completed", None), (None, step)]
        kept = cursor_of(worker, setting)
        assert kept is not None and kept[3] is False, "the claim went on from its cursor"
        rows = [(got[1][2], got[1][3])]


def test_a_past_run_at_and_a_better_priority_are_claimed_first(connect: Connect) -> None:
    claimer, other = connect(), connect()
    start_cursor(claimer, ["order"])
    for _ in range(3):
        enqueue(other, "order", priority=5)
    assert len(claim(claimer, "order")) == 1
    past = enqueue(other, "order", priority=5, run_at="2000-01-01 00:00:00+00")
    better = enqueue(other, "order", priority=0)
    assert claim(claimer, "order", batch=2) == [better, past]


def test_a_better_priority_job_that_comes_due_is_claimed_first(connect: Connect) -> None:
    claimer, other = connect(), connect()
    claimer.execute("set treadle.now = '2999-01-01 12:00:00+00'")
    other.execute("set treadle.now = '2999-01-01 12:00:00+00'")
    start_cursor(claimer, ["due"])
    soon = enqueue(other, "due", priority=-1, run_at="2999-01-01 12:00:05+00")
    waiting = [enqueue(other, "due", priority=3) for _ in range(4)]
    assert claim(claimer, "due") == waiting[:1]  # the first claim saw the future lane
    assert cursor_of(claimer, value(claimer, CURSOR_NAME, (["due"], None))) is not None
    claimer.execute("set treadle.now = '2999-01-01 12:00:04+00'")
    assert claim(claimer, "due") == waiting[1:2]
    claimer.execute("set treadle.now = '2999-01-01 12:00:06+00'")
    assert claim(claimer, "due", batch=2) == [soon, waiting[2]]


def test_jobs_made_claimable_again_are_claimed_by_the_cursor_holder(connect: Connect) -> None:
    """fail, release, retry, snooze and rescue put a job back; the claimer's next claims find it."""
    claimer, admin = connect(), connect()
    start_cursor(claimer, ["again"])
    ids = [enqueue(admin, "again", priority=-1, max_attempts=5) for _ in range(5)]
    rows = claimer.execute(
        "select id, lease_token from treadle.claim('w', array['again'], batch => 5, lease => '1 second')"
    ).fetchall()
    tokens: dict[int, uuid.UUID] = dict(rows)
    for _ in range(6):
        enqueue(admin, "again", priority=2)
    assert len(claim(claimer, "again", batch=3)) == 3  # the cursor is deep in priority 2 now
    assert value(admin, "select treadle.fail(%s, %s, 'x', '0 seconds')", (ids[0], tokens[ids[0]])) == "retryable"
    assert value(admin, "select treadle.release(%s, %s)", (ids[1], tokens[ids[1]])) == "available"
    assert value(admin, "select treadle.fail(%s, %s, 'x', '1 hour')", (ids[2], tokens[ids[2]])) == "retryable"
    assert value(admin, "select treadle.retry(%s)", (ids[2],)) is True
    assert value(admin, "select treadle.snooze(%s, %s, '0 seconds')", (ids[4], tokens[ids[4]])) == "available"
    time.sleep(1.1)  # ids[3]'s lease runs out
    assert value(admin, "select treadle.rescue()") == 1
    assert sorted(claim(claimer, "again", batch=5)) == sorted(ids)


def test_rows_a_rolled_back_claim_held_are_claimed_after_the_sweep(connect: Connect) -> None:
    claimer, aborter, other = connect(), connect(autocommit=False), connect()
    for conn in (claimer, aborter, other):
        conn.execute("set treadle.now = '2999-01-01 12:00:00+00'")
    start_cursor(claimer, ["abort"])
    ids = [enqueue(other, "abort") for _ in range(6)]
    assert claim(aborter, "abort", batch=2) == ids[:2]  # locked, not yet committed
    assert claim(claimer, "abort", batch=2) == ids[2:4]  # skipped them: the cursor is past
    aborter.rollback()
    assert claim(claimer, "abort", batch=5) == ids[4:]  # hidden from this cursor for now
    assert claim(claimer, "abort", batch=5) == []
    assert cursor_of(claimer, value(claimer, CURSOR_NAME, (["abort"], None))) is not None
    claimer.execute("set treadle.now = '2999-01-01 12:01:01+00'")  # past the 60 s sweep
    assert claim(claimer, "abort", batch=5) == ids[:2]


def test_a_cursor_over_too_many_priorities_claims_plainly_until_the_sweep(connect: Connect) -> None:
    claimer, other = connect(), connect()
    for conn in (claimer, other):
        conn.execute("set treadle.now = '2999-01-01 12:00:00+00'")
    start_cursor(claimer, ["many"])
    name = value(claimer, CURSOR_NAME, (["many"], None))
    ids = {p: enqueue(other, "many", priority=p) for p in range(40, 0, -1)}
    assert claim(claimer, "many", batch=3) == [ids[1], ids[2], ids[3]]
    cursor = cursor_of(claimer, name)
    assert cursor is not None and cursor[3] is True, "40 lanes: a plain cursor"
    past = enqueue(other, "many", priority=4, run_at="2000-01-01 00:00:00+00")
    assert claim(claimer, "many", batch=2) == [past, ids[4]]
    claimer.execute("set treadle.now = '2999-01-01 12:01:01+00'")
    assert claim(claimer, "many") == [ids[5]]  # the sweep finds 36 lanes: plain claims
    after = cursor_of(claimer, name)  # none when the sweep was quick, else a plain one from it
    assert after is None or (after[3] is True and after[2] == value(claimer, "select treadle._us(treadle.now())"))


def test_a_tampered_cursor_delays_only_its_own_session(connect: Connect) -> None:
    tamperer, other, producer = connect(), connect(), connect()
    start_cursor(tamperer, ["tamper"])
    first = enqueue(producer, "tamper")
    assert claim(tamperer, "tamper") == [first]
    name = value(tamperer, CURSOR_NAME, (["tamper"], None))
    assert cursor_of(tamperer, name) is not None
    now = value(tamperer, "select treadle._us(treadle.now())")
    for junk in [
        "garbage",
        "{1,2}",
        "{1,99999999999999999999,1,1,1}",
        "{1,1,1,-5,1}",
        "{}",
        "",
        "{1,1,1,1,0,99,99,99,99,99}",
        "(1,2)",
        "(1,1,1,t,,,,,,,)",  # plain, but swept long ago
        f"(2,{now},{now},f,0,{{}},{{}},{{}},{{}},{{}},{{}})",  # another layout
        f"(1,99999999999999999,{now},f,0,{{}},{{}},{{}},{{}},{{}},{{}})",  # taken in the future
        f"(1,{now},{now},f,-5,{{}},{{}},{{}},{{}},{{}},{{}})",
        f"(1,{now},{now},f,9999999999999999999,{{}},{{}},{{}},{{}},{{}},{{}})",  # 19 digits: over a bigint
        f'(1,{now},{now},f,0,"{{1,99999999999999999999}}",{{}},{{}},{{}},{{}},{{}})',
        f"(1,{now},{now},f,0,{{-1}},{{}},{{}},{{}},{{}},{{}})",
        f'(1,{now},{now},f,0,"{{}},{{}},{{}},{{}},{{}},{{}})',  # an open quote
        f"(1,{now},{now},f,0,{{}},{{1,1}},{{0}},{{1}},{{1}},{{1}})",  # a comma out of quotes
        f"(1,{now},{now},f,0,{{}},{{2}},{{0}},{{1}},{{1}},{{1}})",  # a queue out of range
        f"(1,{now},{now},f,0,{{}},{{1}},{{1}},{{1}},{{1}},{{1}})",  # a name without names
        f'(1,{now},{now},f,0,{{}},{{1}},{{0}},"{{1,2}}",{{1}},{{1}})',  # lanes of different lengths
        f"(1,{now},{now},f,0,{{}},{{1}},{{0}},{{99999999999}},{{1}},{{1}})",  # a priority out of range
        f"(1,{now},{now},f,0,{{}},{{1}},{{0}},{{0}},{{NULL}},{{1}})",
        f"(1,{now},{now},f,0,{{}},{{1}},{{0}},{{0}},{{-999999999999999999}},{{1}})",  # before any time
        f"(1,{now},{now},f,0,{{}},{{1}},{{0}},{{0}},{{999999999999999999}},{{1}})",  # after any time
    ]:
        job = enqueue(producer, "tamper")
        tamperer.execute("select set_config(%s, %s, false)", (name, junk))
        assert claim(tamperer, "tamper") == [job], f"a claim after the cursor {junk!r}"

    for conn in (tamperer, other, producer):
        conn.execute("set treadle.now = '2999-01-01 12:00:00+00'")
    start_cursor(tamperer, ["tamper"])
    assert claim(tamperer, "tamper") == []  # a fresh cursor from a claim at 12:00:00
    assert cursor_of(tamperer, name) is not None
    hidden = enqueue(producer, "tamper")
    # a cursor whose lanes start far in the future and whose snapshot saw everything
    tamperer.execute(
        """select set_config(%(name)s, row(c.version, c.taken_at, c.swept_at, c.plain, 2 ^ 59, c.xip,
                                           c.lane_queue, c.lane_name, c.lane_priority,
                                           array_fill(10 ^ 17, array[cardinality(c.lane_queue)]), c.lane_id
                                       )::treadle._claim_cursor::text, false)
             from (select (current_setting(%(name)s)::treadle._claim_cursor).*) as c""",
        {"name": name},
    )
    assert claim(tamperer, "tamper") == []  # its own claims are delayed
    assert claim(other, "tamper") == [hidden]  # nobody else's
    again = enqueue(producer, "tamper")
    tamperer.execute("set treadle.now = '2999-01-01 12:01:01+00'")
    assert claim(tamperer, "tamper") == [again]  # the sweep replaces the cursor
    assert value(producer, "select count(*) from treadle.jobs where queue = 'tamper' and attempt <> 1") == 0


def test_many_claimers_and_producers_with_a_held_snapshot_claim_every_job_once(connect: Connect) -> None:
    """Producers enqueue in short and in long transactions, over several priorities and
    some in the past, while claimers fail some jobs back; a REPEATABLE READ snapshot stays
    open throughout. Every job is claimed, each success exactly once."""
    holder = connect(autocommit=False)
    holder.execute("set transaction isolation level repeatable read")
    holder.execute("select count(*) from treadle.workflows").fetchall()
    producers, claimers = 3, 6
    per_producer = 400
    produced: list[int] = []
    produced_lock = threading.Lock()
    done = threading.Event()

    def produce(n: int) -> None:
        conn = connect(autocommit=False)
        rnd = random.Random(n)
        made = 0
        while made < per_producer:
            size = rnd.choice([1, 1, 5, 20])
            ids = [
                enqueue(
                    conn,
                    "mix",
                    priority=rnd.choice([0, 0, 1, 5]),
                    run_at=rnd.choice([None, "2000-01-01 00:00:00+00"]),
                    max_attempts=3,
                )
                for _ in range(size)
            ]
            if rnd.random() < 0.2:
                time.sleep(0.05)  # a long transaction: its jobs commit behind many others
            conn.commit()
            with produced_lock:
                produced.extend(ids)
            made += size

    def work(n: int) -> Counter[int]:
        conn = connect()
        if n % 2:
            start_cursor(conn, ["mix"])  # half the claimers with a cursor, half without
        rnd = random.Random(100 + n)
        completed: Counter[int] = Counter()
        idle_since: float | None = None
        while True:
            rows = conn.execute(
                "select id, lease_token, attempt from treadle.claim(%s, array['mix'], batch => %s)",
                (f"c{n}", rnd.choice([1, 3, 10])),
            ).fetchall()
            if not rows:
                if done.is_set():
                    if idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > 0.5:
                        return completed
                time.sleep(0.002)
                continue
            idle_since = None
            for job_id, token, attempt in rows:
                if attempt == 1 and rnd.random() < 0.1:
                    assert (
                        value(conn, "select treadle.fail(%s, %s, 'again', '0 seconds')", (job_id, token)) == "retryable"
                    )
                else:
                    assert value(conn, "select treadle.complete(%s, %s)", (job_id, token)) == "completed"
                    completed[job_id] += 1

    with ThreadPoolExecutor(producers + claimers) as pool:
        workers = [pool.submit(work, n) for n in range(claimers)]
        makers = [pool.submit(produce, n) for n in range(producers)]
        for f in makers:
            f.result()
        done.set()
        counts = sum((f.result() for f in workers), Counter())
    holder.rollback()

    assert len(produced) == len(set(produced)) >= producers * per_producer
    assert set(counts) == set(produced), "every job was completed"
    assert max(counts.values()) == 1, "no job was completed twice"
    check = connect()
    assert value(check, "select count(*) from treadle.jobs where queue = 'mix' and state <> 'completed'") == 0


def test_rescue_finds_leases_that_ran_out_since_its_previous_call(connect: Connect) -> None:
    rescuer, worker, producer = connect(), connect(), connect()
    assert value(rescuer, "select treadle.rescue()") == 0  # the session's rescue cursor starts
    first = enqueue(producer, "lease")
    assert claim_with_lease(worker, "lease", "1 second") == [first]
    assert value(rescuer, "select treadle.rescue()") == 0
    time.sleep(1.1)
    second = enqueue(producer, "lease")
    assert claim_with_lease(worker, "lease", "1 second") == [second]
    assert value(rescuer, "select treadle.rescue()") == 1
    assert value(producer, "select state from treadle.jobs where id = %s", (first,)) == "retryable"
    time.sleep(1.1)
    assert value(rescuer, "select treadle.rescue()") == 1
    assert value(rescuer, "select treadle.rescue()") == 0
    assert value(producer, "select state from treadle.jobs where id = %s", (second,)) == "retryable"


def claim_with_lease(conn: psycopg.Connection, queue: str, lease: str) -> list[int]:
    rows = conn.execute(
        "select id from treadle.claim('w', array[%s], lease => %s::interval, lease_token => %s)",
        (queue, lease, uuid.uuid4()),
    )
    return [r[0] for r in rows.fetchall()]


def rescue_calls(conn: psycopg.Connection, seconds: float) -> int:
    """Call rescue() every 0.1 s for `seconds`, as a worker does; how many jobs it moved."""
    moved = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        moved += int(value(conn, "select treadle.rescue()"))
        time.sleep(0.1)
    return moved


def rescue_until_moved(conn: psycopg.Connection, seconds: float = 70.0) -> int:
    """Call rescue() every 0.1 s until it moves a job, for at most `seconds`; how many it moved.

    A lease below where a session's recent calls read is found at its next pass from the
    floor: once every transaction that had an id at its last such pass has ended, and at
    the latest a minute after that pass (treadle.rescue). On a server shared with other
    tests, their transactions can hold that minute."""
    moved = 0
    deadline = time.monotonic() + seconds
    while moved == 0 and time.monotonic() < deadline:
        moved = int(value(conn, "select treadle.rescue()"))
        if moved == 0:
            time.sleep(0.1)
    return moved


def test_rescue_finds_a_lease_committed_after_it_ran_out(connect: Connect) -> None:
    """A claim that commits 2 s after its 1 s lease ran out lies below where the rescuer's
    previous calls read: the same session finds it once the claim has committed."""
    rescuer, producer, slow = connect(), connect(), connect(autocommit=False)
    assert rescue_calls(rescuer, 0.3) == 0  # the session's cursor starts
    job = enqueue(producer, "late-lease")
    assert claim_with_lease(slow, "late-lease", "1 second") == [job]
    assert rescue_calls(rescuer, 2.5) == 0, "an uncommitted claim is not seen"
    slow.commit()
    assert rescue_until_moved(rescuer) == 1
    assert value(producer, "select state from treadle.jobs where id = %s", (job,)) == "retryable"


def test_rescue_finds_a_lease_that_was_locked_when_it_looked(connect: Connect) -> None:
    """An expired lease that another session holds locked is skipped; the same rescuer
    takes it at its next call once the lock is gone, however far its reads have moved on
    meanwhile. (A transaction that has an id, open since before the rescuer's first pass,
    keeps the floor where it is, so that the calls read from a second before the call
    before them: the lease is behind them by then, and would wait for the next pass from
    the floor, a minute, were it not read again.)"""
    rescuer, producer, worker, locker = connect(), connect(), connect(), connect(autocommit=False)
    holder = connect(autocommit=False)
    holder.execute("select pg_current_xact_id()")
    assert rescue_calls(rescuer, 0.3) == 0
    job = enqueue(producer, "locked-lease")
    assert claim_with_lease(worker, "locked-lease", "1 second") == [job]
    locker.execute("select id from treadle.jobs where id = %s for update", (job,))
    assert rescue_calls(rescuer, 2.5) == 0, "a locked row is skipped"
    locker.rollback()
    assert value(rescuer, "select treadle.rescue()") == 1, "the next call reads the held lease again"
    holder.rollback()
    assert value(producer, "select state from treadle.jobs where id = %s", (job,)) == "retryable"


def test_a_tampered_rescue_cursor_reads_from_the_start(connect: Connect) -> None:
    """A rescue cursor set by hand (into the future, malformed) raises nothing and hides nothing."""
    rescuer, producer, worker = connect(), connect(), connect()
    job = enqueue(producer, "tampered-lease")
    assert claim_with_lease(worker, "tampered-lease", "1 second") == [job]
    time.sleep(1.1)
    future = "(1,99999999999999999,99999999999999999,99999999999999999,1,99999999999999999)"
    moved = []
    for cursor in [
        future,
        "(1,1,2,3,4)",
        "(1,1,1,1,99999999999,1)",
        "(1,1,1,1,1,999999999999999999999)",
        "(2,1,,,,1)",
        "(1,,,,,)",
        "garbage",
        "{2,1,1,1,1,1}",
        "{2,NULL,NULL,NULL,NULL,NULL}",
        "\x01",
        "",
    ]:
        rescuer.execute("select set_config('treadle.rescue_cursor', %s, false)", (cursor,))
        moved.append(value(rescuer, "select treadle.rescue()"))
    assert moved == [1] + [0] * 10
    assert value(producer, "select state from treadle.jobs where id = %s", (job,)) == "retryable"
