"""Expired leases rescued across sessions: the old token is refused everywhere, the new
claimer's token works, and rescuers running at once count each job once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect, WaitBlocked, row, value

# Each fenced write, and its answer to a token that no longer holds the job
STALE_WRITES = [
    ("select treadle.heartbeat(%s, %s)", ("lost",)),
    ("select treadle.progress(%s, %s, 0.5)", (False,)),
    ("select treadle.complete(%s, %s, '{}')", (None,)),
    ("select state from treadle.complete_many(array[%s]::bigint[], array[%s]::uuid[])", (None,)),
    ("select treadle.fail(%s, %s, 'late')", (None,)),
    ("select treadle.release(%s, %s)", (None,)),
]


def rescue_until(conn: psycopg.Connection, expected: int) -> int:
    """Call rescue() until it has moved `expected` jobs in all (the leases are real)."""
    moved = 0
    deadline = time.monotonic() + 60
    while moved < expected and time.monotonic() < deadline:
        row = conn.execute("select treadle.rescue()").fetchone()
        assert row is not None
        moved += row[0]
        if moved < expected:
            time.sleep(0.1)
    return moved


def test_an_expired_lease_is_rescued_and_its_token_refused(connect: Connect) -> None:
    producer, dead_worker, rescuer, new_worker = connect(), connect(), connect(), connect()
    job_id = value(producer, "select treadle.enqueue('slow', queue => 'r')")
    old = dead_worker.execute(
        "select id, lease_token from treadle.claim('dead', array['r'], lease => '1 second')"
    ).fetchone()
    assert old is not None and old[0] == job_id
    old_token = old[1]

    assert rescue_until(rescuer, 1) == 1
    state = producer.execute("select state, attempt, lease_token from treadle.jobs where id = %s", (job_id,)).fetchone()
    assert state == ("retryable", 1, None)

    # the dead worker comes back: every fenced write is refused and changes nothing
    for sql, refused in STALE_WRITES:
        assert dead_worker.execute(sql, (job_id, old_token)).fetchone() == refused, sql
    after = producer.execute(
        "select state, attempt, result, progress from treadle.jobs where id = %s", (job_id,)
    ).fetchone()
    assert after == ("retryable", 1, None, None)

    # claimed again at once, by another worker, with a new token; the old one stays refused
    new = new_worker.execute("select id, lease_token, attempt from treadle.claim('new', array['r'])").fetchone()
    assert new is not None and new[0] == job_id and new[2] == 2 and new[1] != old_token
    new_token = new[1]
    for sql, refused in STALE_WRITES:
        assert dead_worker.execute(sql, (job_id, old_token)).fetchone() == refused, sql
    assert new_worker.execute("select treadle.heartbeat(%s, %s)", (job_id, new_token)).fetchone() == ("held",)
    assert new_worker.execute("select treadle.progress(%s, %s, 0.9)", (job_id, new_token)).fetchone() == (True,)
    assert new_worker.execute('select treadle.complete(%s, %s, \'{"by": "new"}\')', (job_id, new_token)).fetchone() == (
        "completed",
    )
    final = producer.execute("select state, result, worker_id from treadle.jobs where id = %s", (job_id,)).fetchone()
    assert final == ("completed", {"by": "new"}, "new")


def test_a_slow_complete_waits_for_a_rescue_and_is_refused(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    """The rescue holds the row in an open transaction; the old worker's complete waits, then gets null."""
    worker, rescuer = connect(), connect(autocommit=False)
    worker.execute("select treadle.enqueue('slow', queue => 'r')")
    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['r'])")
    rescuer.execute("select set_config('treadle.now', (now() + interval '1 hour')::text, false)")
    assert rescuer.execute("select treadle.rescue()").fetchone() == (1,)

    answer: list[Any] = []
    late = connect()
    thread = threading.Thread(
        target=lambda: answer.append(late.execute("select treadle.complete(%s, %s)", (job_id, token)).fetchone())
    )
    thread.start()
    wait_until_blocked(late.info.backend_pid)
    rescuer.commit()
    thread.join(60)
    assert answer == [(None,)]
    assert worker.execute("select state from treadle.jobs where id = %s", (job_id,)).fetchone() == ("retryable",)


def test_a_rescue_skips_a_job_being_completed(connect: Connect) -> None:
    """The worker's complete holds the row; a rescue at the same time skips it, and the complete stands."""
    worker, rescuer = connect(autocommit=False), connect()
    worker.execute("select treadle.enqueue('slow', queue => 'r')")
    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['r'])")
    worker.commit()
    assert worker.execute("select treadle.complete(%s, %s)", (job_id, token)).fetchone() == ("completed",)
    rescuer.execute("select set_config('treadle.now', (now() + interval '1 hour')::text, false)")
    assert rescuer.execute("select treadle.rescue()").fetchone() == (0,)
    worker.commit()
    assert rescuer.execute("select state, attempt from treadle.jobs where id = %s", (job_id,)).fetchone() == (
        "completed",
        1,
    )


def test_rescuers_at_once_count_each_job_once(connect: Connect) -> None:
    jobs, rescuers = 300, 6
    setup = connect()
    setup.execute(
        "select treadle.enqueue_many((select jsonb_agg(jsonb_build_object('name', 'x', 'queue', 'many')) "
        "from generate_series(1, %s)))",
        (jobs,),
    )
    claimed = setup.execute("select count(*) from treadle.claim('w', array['many'], batch => 1000)").fetchone()
    assert claimed == (jobs,)

    conns = [connect() for _ in range(rescuers)]
    for conn in conns:
        # every rescuer's clock is an hour ahead: every lease has expired for them
        conn.execute("select set_config('treadle.now', (now() + interval '1 hour')::text, false)")
    start = threading.Barrier(rescuers)

    def rescue(conn: psycopg.Connection) -> int:
        start.wait()
        total = 0
        for _ in range(5):
            total += value(conn, "select treadle.rescue()")
        return total

    with ThreadPoolExecutor(rescuers) as pool:
        counts = list(pool.map(rescue, conns))

    assert sum(counts) == jobs
    rows = setup.execute(
        "select state, attempt, jsonb_array_length(errors), count(*) from treadle.jobs group by 1, 2, 3"
    ).fetchall()
    assert rows == [("retryable", 1, 1, jobs)]


def test_a_rescue_tells_each_queue_what_it_moved(connect: Connect) -> None:
    """treadle_done for the queues where rescued jobs finished (discarded, cancelled, with or
    without follow-ups), treadle_jobs for a retry due at once; nothing for the others, and
    only on commit."""
    listener, producer, worker = connect(), connect(), connect()
    rescuer = connect(autocommit=False)
    assert value(listener, "select treadle.listen_done(null)")
    listener.execute("listen treadle_jobs")
    listener.execute("listen treadle_done")
    producer.execute("select treadle.enqueue('a', queue => 'rn-discard', max_attempts => 1)")
    producer.execute("select treadle.enqueue('b', queue => 'rn-retry', max_attempts => 3)")
    cancelled = value(producer, "select treadle.enqueue('c', queue => 'rn-cancel')")
    producer.execute("select treadle.enqueue('d', queue => 'rn-every', max_attempts => 1, every => '1 day')")
    claimed = worker.execute(
        "select count(*) from treadle.claim('w', array['rn-discard', 'rn-retry', 'rn-cancel', 'rn-every'], batch => 4)"
    ).fetchone()
    assert claimed == (4,)
    assert value(producer, "select treadle.cancel(%s)", (cancelled,))

    def seen_until(marker: str) -> list[tuple[str, str]]:
        producer.execute("select treadle.enqueue('m', queue => %s)", (marker,))
        seen: list[tuple[str, str]] = []
        for note in listener.notifies(timeout=30):
            seen.append((note.channel, note.payload))
            if seen[-1] == ("treadle_jobs", marker):
                return seen[:-1]
        raise AssertionError(f"no marker {marker}; saw {seen}")

    seen_until("rn-marker-0")  # what the setup sent
    rescuer.execute("select set_config('treadle.now', (now() + interval '1 hour')::text, false)")
    assert value(rescuer, "select treadle.rescue()") == 4
    assert seen_until("rn-marker-1") == []  # not before the commit
    rescuer.commit()
    seen = set(seen_until("rn-marker-2"))
    assert {("treadle_done", "rn-discard"), ("treadle_done", "rn-cancel"), ("treadle_done", "rn-every"),
            ("treadle_jobs", "rn-retry")} <= seen  # fmt: skip
    assert not {("treadle_done", "rn-retry"), ("treadle_jobs", "rn-discard"), ("treadle_jobs", "rn-cancel")} & seen
    states = producer.execute(
        "select queue, state from treadle.jobs where queue like 'rn-%' and name <> 'm' order by id"
    ).fetchall()
    assert states == [("rn-discard", "discarded"), ("rn-retry", "retryable"), ("rn-cancel", "cancelled"),
                      ("rn-every", "discarded"), ("rn-every", "available")]  # fmt: skip
