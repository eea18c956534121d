"""Many connections claim from limited queues at once: a limit is never exceeded, and
a limited queue still drains (never starved), beside an unlimited one."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg

from tests.sql.sqlcalls import Connect

CLAIMERS = 12
PATIENCE = 120.0  # a bound that makes a broken drain fail instead of hang; never a speed claim


def fill(conn: psycopg.Connection, queue: str, count: int) -> None:
    conn.execute(
        """select treadle.enqueue_many((select jsonb_agg(jsonb_build_object('name', 'work', 'queue', %s::text))
                                          from generate_series(1, %s)))""",
        (queue, count),
    )


def running(conn: psycopg.Connection, queue: str) -> int:
    row = conn.execute("select count(*) from treadle.jobs where queue = %s and state = 'running'", (queue,)).fetchone()
    assert row is not None
    return int(row[0])


def test_concurrent_claimers_never_exceed_a_concurrency_limit_and_drain_it(connect: Connect) -> None:
    setup = connect()
    fill(setup, "limited", 300)
    fill(setup, "free", 300)
    setup.execute("select treadle.set_queue('limited', concurrency => 3)")
    conns = [connect() for _ in range(CLAIMERS)]
    start = threading.Barrier(CLAIMERS + 1)
    done = threading.Event()
    seen: list[int] = []  # running counts of the limited queue, read after each claim and by a watcher
    counter, lock = connect(), threading.Lock()

    def unfinished() -> int:
        with lock:
            row = counter.execute("select count(*) from treadle.jobs where state <> 'completed'").fetchone()
        assert row is not None
        return int(row[0])

    def claimer(i: int) -> int:
        conn = conns[i]
        rng = random.Random(i)
        taken = 0
        start.wait()
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            rows = conn.execute(
                "select id, lease_token from treadle.claim(%s, array['limited', 'free'], batch => %s)",
                (f"w{i}", rng.randint(1, 5)),
            ).fetchall()
            if not rows:
                if unfinished() == 0:
                    return taken
                time.sleep(0.002)
                continue
            seen.append(running(conn, "limited"))
            time.sleep(rng.uniform(0.001, 0.01))  # hold the jobs a little, as handlers do
            conn.execute("select treadle.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
            taken += len(rows)
        raise AssertionError("the queues did not drain")

    watcher_conn = connect()

    def watch() -> None:
        while not done.is_set():
            seen.append(running(watcher_conn, "limited"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(CLAIMERS) as pool:
        futures = [pool.submit(claimer, i) for i in range(CLAIMERS)]
        start.wait()
        taken = [f.result() for f in futures]
    done.set()
    watcher.join()

    assert sum(taken) == 600
    assert max(seen) <= 3, f"the concurrency limit of 3 was exceeded: {max(seen)} running"
    assert max(seen) == 3, "the limited queue never ran at its limit"
    states = setup.execute("select queue, state, count(*) from treadle.jobs group by 1, 2 order by 1").fetchall()
    assert states == [("free", "completed", 300), ("limited", "completed", 300)]


def test_concurrent_claimers_keep_to_a_rate_limit_and_are_not_starved(connect: Connect) -> None:
    setup = connect()
    fill(setup, "rated", 1000)
    setup.execute("select treadle.set_queue('rated', rate_limit => 20, rate_period => '1 second')")
    conns = [connect() for _ in range(CLAIMERS)]
    start = threading.Barrier(CLAIMERS)
    claim_for = 2.0

    def claimer(i: int) -> int:
        conn = conns[i]
        taken = 0
        start.wait()
        until = time.monotonic() + claim_for
        while time.monotonic() < until:
            rows = conn.execute("select id from treadle.claim(%s, array['rated'], batch => 10)", (f"w{i}",)).fetchall()
            taken += len(rows)
            time.sleep(0.005)
        return taken

    began = time.monotonic()
    with ThreadPoolExecutor(CLAIMERS) as pool:
        taken = sum(pool.map(claimer, range(CLAIMERS)))
    elapsed = time.monotonic() - began

    # a full bucket of 20, then 20 per second: never more, whatever the claimers do
    assert taken <= 20 + 20 * elapsed + 1, f"{taken} claims in {elapsed:.2f} s passed 20 + 20/s"
    # and the refill is claimed: more than the first burst (the queue is not starved)
    assert taken > 20, f"only {taken} claims: the rate-limited queue was starved"
    row = setup.execute("select count(*) from treadle.jobs where queue = 'rated' and state = 'running'").fetchone()
    assert row == (taken,)


def test_a_paused_queue_gives_nothing_to_concurrent_claimers_then_everything_once_resumed(connect: Connect) -> None:
    setup = connect()
    fill(setup, "held", 200)
    setup.execute("select treadle.pause('held')")
    conns = [connect() for _ in range(4)]
    for i, conn in enumerate(conns):
        rows = conn.execute("select id from treadle.claim(%s, array['held'], batch => 50)", (f"w{i}",)).fetchall()
        assert rows == []
    assert setup.execute("select treadle.resume('held')").fetchone() == (True,)
    claimed: list[int] = []
    for i, conn in enumerate(conns):
        claimed += [
            r[0] for r in conn.execute("select id from treadle.claim(%s, array['held'], batch => 50)", (f"w{i}",))
        ]
    assert len(claimed) == len(set(claimed)) == 200
