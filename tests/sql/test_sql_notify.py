"""LISTEN/NOTIFY hints: treadle_jobs carries a queue name when work becomes claimable,
treadle_done when jobs finish; both only on commit, never with job data.

Absence is shown without waiting on a timeout: a session's notifications arrive in
commit order, so once a later marker has arrived, an earlier one that never came
was never sent.
"""

from __future__ import annotations

import psycopg

from tests.sql.sqlcalls import Connect, row, value


def listener_for(connect: Connect) -> psycopg.Connection:
    conn = connect()
    conn.execute("listen treadle_jobs")
    conn.execute("listen treadle_done")
    return conn


def received_until(listener: psycopg.Connection, channel: str, payload: str) -> list[tuple[str, str]]:
    """Every notification up to and including (channel, payload); fails after 30 s without it."""
    seen: list[tuple[str, str]] = []
    for note in listener.notifies(timeout=30):
        seen.append((note.channel, note.payload))
        if seen[-1] == (channel, payload):
            return seen
    raise AssertionError(f"no {channel} {payload!r} notification; saw {seen}")


def mark(conn: psycopg.Connection, queue: str) -> None:
    conn.execute("select treadle.enqueue('marker', queue => %s)", (queue,))


def test_enqueue_notifies_its_queue_on_commit_only(connect: Connect) -> None:
    listener = listener_for(connect)
    producer, other = connect(autocommit=False), connect()

    producer.execute("select treadle.enqueue('mail', queue => 'mailq')")
    mark(other, "marker-1")
    assert ("treadle_jobs", "mailq") not in received_until(listener, "treadle_jobs", "marker-1")

    producer.commit()
    assert received_until(listener, "treadle_jobs", "mailq") == [("treadle_jobs", "mailq")]


def test_a_rolled_back_enqueue_notifies_nobody(connect: Connect) -> None:
    listener = listener_for(connect)
    producer, other = connect(autocommit=False), connect()
    producer.execute("select treadle.enqueue('mail', queue => 'rolled-back')")
    producer.rollback()
    mark(other, "marker-2")
    assert received_until(listener, "treadle_jobs", "marker-2") == [("treadle_jobs", "marker-2")]


def test_one_notification_per_queue_per_transaction_and_none_for_future_jobs(connect: Connect) -> None:
    listener = listener_for(connect)
    producer = connect(autocommit=False)
    for _ in range(3):
        producer.execute("select treadle.enqueue('a', queue => 'busy')")
    producer.execute("select treadle.enqueue('later', queue => 'future', run_at => now() + interval '1 hour')")
    producer.execute(
        """select treadle.enqueue_many('[{"name": "b", "queue": "busy"}, {"name": "c", "queue": "many"}]')"""
    )
    producer.commit()
    mark(producer, "marker-3")
    producer.commit()
    seen = received_until(listener, "treadle_jobs", "marker-3")
    assert sorted(seen) == [("treadle_jobs", "busy"), ("treadle_jobs", "many"), ("treadle_jobs", "marker-3")]


def test_finishing_notifies_treadle_done_with_the_queue(connect: Connect) -> None:
    worker = connect()
    for queue in ("done-q", "fail-q", "cancel-q"):
        worker.execute("select treadle.enqueue('x', queue => %s, max_attempts => 1)", (queue,))
    listener = listener_for(connect)

    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['done-q'])")
    worker.execute("select treadle.complete(%s, %s, '{\"secret\": 1}')", (job_id, token))
    assert received_until(listener, "treadle_done", "done-q") == [("treadle_done", "done-q")]

    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['fail-q'])")
    worker.execute("select treadle.fail(%s, %s, 'boom')", (job_id, token))
    assert received_until(listener, "treadle_done", "fail-q") == [("treadle_done", "fail-q")]

    worker.execute("select treadle.cancel(id) from treadle.jobs where queue = 'cancel-q'")
    assert received_until(listener, "treadle_done", "cancel-q") == [("treadle_done", "cancel-q")]


def test_a_retryable_failure_is_not_done_and_a_retry_wakes_workers(connect: Connect) -> None:
    worker = connect()
    job_id = value(worker, "select treadle.enqueue('x', queue => 'again')")
    listener = listener_for(connect)
    token = value(worker, "select lease_token from treadle.claim('w', array['again'])")
    assert worker.execute("select treadle.fail(%s, %s, 'once', '1 hour')", (job_id, token)).fetchone() == ("retryable",)
    assert worker.execute("select treadle.retry(%s)", (job_id,)).fetchone() == (True,)
    assert received_until(listener, "treadle_jobs", "again") == [("treadle_jobs", "again")]


def test_a_finish_rolled_back_notifies_nobody(connect: Connect) -> None:
    setup = connect()
    setup.execute("select treadle.enqueue('x', queue => 'undone')")
    listener = listener_for(connect)
    worker = connect(autocommit=False)
    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['undone'])")
    worker.execute("select treadle.complete(%s, %s)", (job_id, token))
    worker.rollback()
    mark(setup, "marker-4")
    assert received_until(listener, "treadle_jobs", "marker-4") == [("treadle_jobs", "marker-4")]


def test_workflow_steps_wake_workers_of_their_queue(connect: Connect) -> None:
    listener = listener_for(connect)
    producer, worker = connect(), connect()
    producer.execute("select treadle.start_workflow('flow', steps => array['a', 'b'], queue => 'flows')")
    assert received_until(listener, "treadle_jobs", "flows") == [("treadle_jobs", "flows")]

    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['flows'])")
    worker.execute("select treadle.complete(%s, %s)", (job_id, token))
    # one commit: the finished step and the next one, in either order
    seen = received_until(listener, "treadle_done", "flows")
    if ("treadle_jobs", "flows") not in seen:
        seen += received_until(listener, "treadle_jobs", "flows")
    assert sorted(seen) == [("treadle_done", "flows"), ("treadle_jobs", "flows")]


def test_complete_many_notifies_each_queue_once(connect: Connect) -> None:
    worker = connect()
    for queue in ("m1", "m1", "m2"):
        worker.execute("select treadle.enqueue('x', queue => %s)", (queue,))
    listener = listener_for(connect)
    rows = worker.execute("select id, lease_token from treadle.claim('w', array['m1', 'm2'], batch => 3)").fetchall()
    worker.execute("select treadle.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
    mark(worker, "marker-5")
    seen = received_until(listener, "treadle_jobs", "marker-5")
    assert sorted(seen) == [("treadle_done", "m1"), ("treadle_done", "m2"), ("treadle_jobs", "marker-5")]
