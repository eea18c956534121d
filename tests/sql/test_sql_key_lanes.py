"""Many connections claim keyed jobs at once: the jobs of one concurrency key never run
more than key_limit at a time, an ordered lane never reorders, other keys and unkeyed
jobs go on, and every slot count ends at zero.

Each attempt's interval is recorded by its claimer: from the claim's answer to the
finish's call, both inside the time the job truly held its slot (from the claim's
commit to the finish's). The jobs' own started_at and finished_at are statement start
times, which can place a claim that waited before the finish that let it run."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect

CLAIMERS = 8
PATIENCE = 120.0  # a bound that makes a broken drain fail instead of hang; never a speed claim


def unfinished(conn: psycopg.Connection[Any], queue: str) -> int:
    row = conn.execute(
        "select count(*) from treadle.jobs where queue = %s and state <> all (array['completed', 'cancelled'])",
        (queue,),
    ).fetchone()
    assert row is not None
    return int(row[0])


Attempt = tuple[int, float, float, bool]  # job id, claimed, finishing, completed (or failed for a retry)


def drain(connect: Connect, queue: str, fail_one_in: int = 0) -> list[Attempt]:
    """CLAIMERS connections claim (batches of 1 to 3), hold each job a little, then
    complete it, or fail it for a retry now once in fail_one_in attempts; every attempt."""
    attempts: list[Attempt] = []
    conns = [connect() for _ in range(CLAIMERS)]
    counter, lock = connect(), threading.Lock()
    start = threading.Barrier(CLAIMERS)

    def claimer(i: int) -> None:
        conn, rng = conns[i], random.Random(i)
        start.wait()
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            rows = conn.execute(
                "select id, lease_token from treadle.claim(%s, array[%s], batch => %s)",
                (f"w{i}", queue, rng.randint(1, 3)),
            ).fetchall()
            if not rows:
                with lock:
                    if unfinished(counter, queue) == 0:
                        return
                time.sleep(0.002)
                continue
            claimed = time.monotonic()
            time.sleep(rng.uniform(0.001, 0.008))  # hold the jobs, as handlers do
            for job_id, token in rows:
                completes = not (fail_one_in and rng.randrange(fail_one_in) == 0)
                attempts.append((job_id, claimed, time.monotonic(), completes))
                if completes:
                    conn.execute("select treadle.complete(%s, %s)", (job_id, token))
                else:
                    conn.execute("select treadle.fail(%s, %s, 'flaky', retry_in => '0 seconds')", (job_id, token))
        raise AssertionError(f"queue {queue} did not drain")

    with ThreadPoolExecutor(CLAIMERS) as pool:
        for future in [pool.submit(claimer, i) for i in range(CLAIMERS)]:
            future.result()
    return attempts


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one time; one that ends when another starts does not overlap it."""
    events = sorted([(s, 1) for s, _ in intervals] + [(f, -1) for _, f in intervals], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def intervals_by_key(
    conn: psycopg.Connection[Any], queue: str, attempts: list[Attempt]
) -> dict[str | None, list[tuple[float, float]]]:
    keys = dict(conn.execute("select id, concurrency_key from treadle.jobs where queue = %s", (queue,)).fetchall())
    found: dict[str | None, list[tuple[float, float]]] = defaultdict(list)
    for job_id, claimed, finishing, _ in attempts:
        found[keys[job_id]].append((claimed, finishing))
    return found


def test_concurrent_claimers_never_run_more_of_a_key_than_its_limit(connect: Connect) -> None:
    setup = connect()
    setup.execute("select treadle.set_queue('keyed', key_limit => 2)")
    # five keys of 40 jobs and 60 jobs without a key, interleaved
    setup.execute(
        """select treadle.enqueue_many((select jsonb_agg(jsonb_build_object(
               'name', 'work', 'queue', 'keyed', 'concurrency_key', case when i % 4 = 0 then null else 'k' || i % 5 end)
               order by i) from generate_series(1, 240) as i))"""
    )
    by_key = intervals_by_key(setup, "keyed", drain(connect, "keyed"))
    assert sum(len(v) for v in by_key.values()) == 240, "every job ran once"
    assert setup.execute(
        "select count(*) from treadle.jobs where queue = 'keyed' and state = 'completed'"
    ).fetchone() == (240,)
    assert sorted(k for k in by_key if k is not None) == ["k0", "k1", "k2", "k3", "k4"]
    for key, intervals in by_key.items():
        if key is not None:
            assert most_at_once(intervals) <= 2, f"key {key} ran more than 2 at once"
    # that the limit is reached (released exactly, whatever the timing) is pgtap/034_key_lanes.sql's
    assert setup.execute("select count(*) from treadle.key_slots").fetchone() == (0,)


def test_an_ordered_lane_runs_one_at_a_time_in_enqueue_order_through_retries(connect: Connect) -> None:
    setup = connect()
    setup.execute("select treadle.set_queue('lanes', key_ordered => true)")
    setup.execute(
        """select treadle.enqueue_many((select jsonb_agg(jsonb_build_object(
               'name', 'hook', 'queue', 'lanes', 'concurrency_key', 'customer-' || i % 3) order by i)
               from generate_series(1, 90) as i))"""
    )
    attempts = drain(connect, "lanes", fail_one_in=4)
    keys: dict[int, str] = dict(
        setup.execute("select id, concurrency_key from treadle.jobs where queue = 'lanes'").fetchall()
    )
    assert setup.execute(
        "select count(*) from treadle.jobs where queue = 'lanes' and state = 'completed'"
    ).fetchone() == (90,)
    assert not all(completes for *_, completes in attempts), "some attempts failed and were retried"
    lanes: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in sorted(attempts, key=lambda a: a[1]):
        lanes[keys[attempt[0]]].append(attempt)
    assert sorted(lanes) == ["customer-0", "customer-1", "customer-2"]
    for key, runs in lanes.items():
        completed = [job_id for job_id, _, _, completes in runs if completes]
        assert completed == sorted(completed) and len(completed) == 30, f"lane {key} completed out of enqueue order"
        for before, after in pairwise(runs):
            assert after[1] >= before[2], f"lane {key} ran two attempts at once"
            assert after[0] == (before[0] if not before[3] else after[0]), f"lane {key} passed a failed head"
        assert most_at_once([(a[1], a[2]) for a in runs]) == 1
    assert setup.execute("select count(*) from treadle.key_slots").fetchone() == (0,)


def test_enqueuers_and_finishers_of_one_key_never_pass_its_limit(connect: Connect) -> None:
    """Enqueues, completions and cancels of one key race: the slot count stays exact."""
    setup = connect()
    setup.execute("select treadle.set_queue('race', key_limit => 3)")
    stop = threading.Event()
    attempts: list[Attempt] = []

    def enqueuer(i: int) -> None:
        conn = connect()
        for _ in range(60):
            conn.execute("select treadle.enqueue('work', queue => 'race', concurrency_key => 'hot')")

    def canceller() -> None:
        conn = connect()
        while not stop.is_set():
            conn.execute(
                """select treadle.cancel(id) from treadle.jobs
                    where queue = 'race' and state = any (array['blocked', 'available']) order by random() limit 1"""
            )
            time.sleep(0.003)

    cancelling = threading.Thread(target=canceller)
    cancelling.start()
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(enqueuer, i) for i in range(3)]
            attempts += drain(connect, "race")
            for future in futures:
                future.result()
        attempts += drain(connect, "race")
    finally:
        stop.set()
        cancelling.join()
    assert most_at_once(intervals_by_key(setup, "race", attempts)["hot"]) <= 3
    assert setup.execute("select count(*) from treadle.key_slots").fetchone() == (0,)
    assert setup.execute(
        "select count(*) from treadle.jobs where queue = 'race' and state = any (array['completed', 'cancelled'])"
    ).fetchone() == (180,)


def test_finishing_batches_of_several_keys_in_opposite_orders_never_deadlocks(connect: Connect) -> None:
    """Many sessions complete batches whose jobs hold slots of the same keys, enqueued
    in every order ({a, b, c}, {c, b, a}, ...): each finish locks its keys' rows in
    (queue, key) order, so none is chosen as a deadlock victim (40P01 would raise
    here), and every slot count matches the jobs that still hold a slot."""
    setup = connect()
    setup.execute("select treadle.set_queue('cross', key_limit => 1000)")
    orders = [("a", "b", "c"), ("c", "b", "a"), ("b", "c", "a"), ("a", "c", "b"), ("c", "a", "b"), ("b", "a", "c")]
    groups = 240
    setup.execute(
        """select treadle.enqueue_many((select jsonb_agg(jsonb_build_object(
               'name', 'work', 'queue', 'cross', 'concurrency_key', (%s::text[])[(g %% 6) * 3 + p + 1]) order by g, p)
               from generate_series(0, %s - 1) as g, generate_series(0, 2) as p))""",
        ([k for order in orders for k in order], groups),
    )
    claimed = setup.execute(
        "select id, lease_token from treadle.claim('w', array['cross'], batch => %s) order by id", (groups * 3,)
    ).fetchall()
    assert len(claimed) == groups * 3, "every job is released (the limit is not reached) and claimed"
    keys: dict[int, str] = dict(
        setup.execute("select id, concurrency_key from treadle.jobs where queue = 'cross'").fetchall()
    )
    batches = [claimed[i : i + 3] for i in range(0, len(claimed), 3)]
    assert {tuple(keys[job_id] for job_id, _ in batch) for batch in batches} == set(orders)
    kept, finished = batches[:12], batches[12:]  # 12 batches stay running: their slots stay held

    sessions = 8
    conns = [connect() for _ in range(sessions)]
    start = threading.Barrier(sessions)

    def finisher(i: int) -> None:
        conn = conns[i]
        start.wait()
        for batch in finished[i::sessions]:
            rows = conn.execute(
                "select job_id, state from treadle.complete_many(%s, %s)",
                ([job_id for job_id, _ in batch], [token for _, token in batch]),
            ).fetchall()
            assert [state for _, state in rows] == ["completed"] * 3

    with ThreadPoolExecutor(sessions) as pool:
        for future in [pool.submit(finisher, i) for i in range(sessions)]:
            future.result()  # a deadlock victim's 40P01 raises here

    assert setup.execute("select key, held from treadle.key_slots where queue = 'cross' order by key").fetchall() == [
        ("a", 12),
        ("b", 12),
        ("c", 12),
    ]
    assert setup.execute(
        """select concurrency_key, count(*) from treadle.jobs
            where queue = 'cross' and key_slot group by 1 order by 1"""
    ).fetchall() == [("a", 12), ("b", 12), ("c", 12)]
    assert setup.execute(
        "select count(*) from treadle.jobs where queue = 'cross' and state = 'completed'"
    ).fetchone() == ((groups - 12) * 3,)
    assert len(kept) == 12


def test_concurrent_first_enqueues_of_a_new_key_take_key_limit_slots(connect: Connect) -> None:
    """Enqueues of a key with no row yet race: the first inserts the key's row with its slot
    taken (its job inserted available), the others wait for it and go through the lane, so
    exactly key_limit jobs are released and the count matches them, whatever the order."""
    setup = connect()
    setup.execute("select treadle.set_queue('first-race', key_limit => 2)")
    producers = [connect(autocommit=False) for _ in range(8)]
    start = threading.Barrier(len(producers))

    def produce(conn: psycopg.Connection[Any]) -> None:
        start.wait()
        conn.execute("select treadle.enqueue('x', queue => 'first-race', concurrency_key => 'k')")
        time.sleep(0.05)  # the transactions overlap
        conn.commit()

    with ThreadPoolExecutor(len(producers)) as pool:
        list(pool.map(produce, producers))
    states: dict[str, int] = dict(
        setup.execute("select state, count(*) from treadle.jobs where queue = 'first-race' group by state").fetchall()
    )
    assert states == {"available": 2, "blocked": 6}
    held = setup.execute(
        "select held, (select count(*) from treadle.jobs where queue = 'first-race' and key_slot)"
        "  from treadle.key_slots where queue = 'first-race' and key = 'k'"
    ).fetchone()
    assert held == (2, 2)


def test_a_rolled_back_first_enqueue_of_a_key_leaves_no_slot(connect: Connect) -> None:
    conn = connect(autocommit=False)
    conn.execute("select treadle.enqueue('x', queue => 'first-undone', concurrency_key => 'k')")
    conn.rollback()
    assert conn.execute("select count(*) from treadle.key_slots where queue = 'first-undone'").fetchone() == (0,)
    job_id = conn.execute(
        "select treadle.enqueue('x', queue => 'first-undone', concurrency_key => 'k',"
        "                       run_at => now() + interval '1 hour')"
    ).fetchone()
    conn.commit()
    assert job_id is not None
    row = conn.execute("select state, key_slot from treadle.jobs where id = %s", job_id).fetchone()
    assert row == ("available", True)  # the key's first job holds its slot, due or not
    later = conn.execute("select treadle.enqueue('x', queue => 'first-undone', concurrency_key => 'k')").fetchone()
    conn.commit()
    assert later is not None
    # due first: the job due now takes the slot from the one an hour ahead
    assert conn.execute("select state from treadle.jobs where id = %s", later).fetchone() == ("available",)
    assert conn.execute("select state from treadle.jobs where id = %s", job_id).fetchone() == ("blocked",)
