"""LISTEN/NOTIFY hints: treadle_jobs carries a queue name when work becomes claimable,
treadle_done when jobs finish, to sessions that wait on the queue (treadle.listen_done);
both only on commit, never with job data.

Absence is shown without waiting on a timeout: a session's notifications arrive in
commit order, so once a later marker has arrived, an earlier one that never came
was never sent.
"""

from __future__ import annotations

import time

import psycopg

from tests.sql.sqlcalls import Connect, row, value


def listener_for(connect: Connect, waits_on: str | None = "every queue") -> psycopg.Connection:
    """A session that LISTENs to both channels, waiting for finishes on a queue, on every queue, or (None) none."""
    conn = connect()
    if waits_on is not None:
        assert value(conn, "select treadle.listen_done(%s)", (None if waits_on == "every queue" else waits_on,))
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


def claim_step(worker: psycopg.Connection, queue: str, step: str) -> tuple[int, object]:
    """Claim one job of `step` of workflow 'flow' in `queue`: (id, lease_token)."""
    claim = "select id, lease_token from treadle.claim('w', array[%s], names => array[%s])"
    return row(worker, claim, (queue, f"workflow:flow/{step}"))


def test_a_step_behind_a_backlog_of_its_name_wakes_nobody(connect: Connect) -> None:
    """A job of the same queue and name that has waited 50 ms or more: its workers are busy, and take the next
    one when a slot frees; a NOTIFY would only make finishing workers commit one at a time."""
    listener = listener_for(connect, waits_on=None)
    producer, worker = connect(), connect()
    for _ in range(2):
        producer.execute("select treadle.start_workflow('flow', steps => array['a', 'b'], queue => 'backlog')")
    mark(producer, "marker-b1")
    received_until(listener, "treadle_jobs", "marker-b1")

    job_id, token = claim_step(worker, "backlog", "a")
    worker.execute("select treadle.complete(%s, %s)", (job_id, token))
    mark(worker, "marker-b2")
    assert ("treadle_jobs", "backlog") in received_until(listener, "treadle_jobs", "marker-b2")  # nothing waited

    time.sleep(0.1)  # the first b has now waited 100 ms
    job_id, token = claim_step(worker, "backlog", "a")
    worker.execute("select treadle.complete(%s, %s)", (job_id, token))
    mark(worker, "marker-b3")
    assert ("treadle_jobs", "backlog") not in received_until(listener, "treadle_jobs", "marker-b3")
    assert value(worker, "select count(*) from treadle.jobs where step = 'b' and state = 'available'") == 2


def test_complete_and_claim_that_takes_the_next_step_wakes_nobody(connect: Connect) -> None:
    listener = listener_for(connect, waits_on=None)
    producer, worker = connect(), connect()
    run_id = value(producer, "select treadle.start_workflow('flow', steps => array['a', 'b'], queue => 'along')")
    assert received_until(listener, "treadle_jobs", "along") == [("treadle_jobs", "along")]

    job_id, token = claim_step(worker, "along", "a")
    rows = worker.execute(
        "select finished_state, (job).step"
        " from treadle.complete_and_claim(%s, %s, null, 'w', array['along'], batch => 5)",
        ([job_id], [token]),
    ).fetchall()
    assert rows == [("completed", None), (None, "b")]  # it runs b next itself
    mark(worker, "marker-c1")
    assert ("treadle_jobs", "along") not in received_until(listener, "treadle_jobs", "marker-c1")
    state = value(worker, "select state from treadle.jobs where workflow_run_id = %s and step = 'b'", (run_id,))
    assert state == "running"


def test_complete_and_claim_that_leaves_the_next_step_wakes_its_workers(connect: Connect) -> None:
    listener = listener_for(connect, waits_on=None)
    producer, worker = connect(), connect()
    producer.execute("select treadle.start_workflow('flow', steps => array['a', 'b'], queue => 'left')")
    assert received_until(listener, "treadle_jobs", "left") == [("treadle_jobs", "left")]

    job_id, token = claim_step(worker, "left", "a")
    # this worker runs only a: b is for others, who must hear of it
    rows = worker.execute(
        "select finished_state, (job).id from treadle.complete_and_claim(%s, %s, null, 'w', array['left'],"
        " names => array['workflow:flow/a'], batch => 5)",
        ([job_id], [token]),
    ).fetchall()
    assert rows == [("completed", None)]
    assert received_until(listener, "treadle_jobs", "left") == [("treadle_jobs", "left")]
    # the rest of its transaction is told of as anywhere else
    assert value(worker, "select current_setting('treadle.claim_follows', true)") in (None, "")


def test_a_graph_step_left_by_complete_and_claim_wakes_its_workers(connect: Connect) -> None:
    """Two steps become ready; a claim of one takes one of them, the other waits for another worker."""
    listener = listener_for(connect, waits_on=None)
    producer, worker = connect(), connect()
    producer.execute(
        "select treadle.start_workflow('flow', steps => array['a', 'b', 'c'], after => %s::jsonb, queue => 'split')",
        ('{"b": ["a"], "c": ["a"]}',),
    )
    assert received_until(listener, "treadle_jobs", "split") == [("treadle_jobs", "split")]
    job_id, token = claim_step(worker, "split", "a")
    rows = worker.execute(
        "select (job).step from treadle.complete_and_claim(%s, %s, null, 'w', array['split'], batch => 1)"
        " where finished_id is null",
        ([job_id], [token]),
    ).fetchall()
    assert rows == [("b",)]
    assert received_until(listener, "treadle_jobs", "split") == [("treadle_jobs", "split")]


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


def finish_one(worker: psycopg.Connection, queue: str) -> None:
    worker.execute("select treadle.enqueue('x', queue => %s)", (queue,))
    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array[%s])", (queue,))
    worker.execute("select treadle.complete(%s, %s)", (job_id, token))


def test_a_finish_nobody_waits_for_notifies_nobody(connect: Connect) -> None:
    listener = listener_for(connect, waits_on=None)  # LISTENs, never registered
    worker = connect()
    finish_one(worker, "unwatched")
    worker.execute("select treadle.enqueue('x', queue => 'unwatched-fail', max_attempts => 1)")
    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['unwatched-fail'])")
    worker.execute("select treadle.fail(%s, %s, 'boom')", (job_id, token))
    mark(worker, "marker-6")
    assert [note for note in received_until(listener, "treadle_jobs", "marker-6") if note[0] == "treadle_done"] == []


def test_a_waiter_on_one_queue_hears_that_queue_only(connect: Connect) -> None:
    listener = listener_for(connect, waits_on="watched")
    worker = connect()
    finish_one(worker, "other")
    finish_one(worker, "watched")
    mark(worker, "marker-7")
    seen = received_until(listener, "treadle_jobs", "marker-7")
    assert ("treadle_done", "watched") in seen
    assert ("treadle_done", "other") not in seen


def test_waiting_ends_with_unlisten_done_and_with_the_session(connect: Connect) -> None:
    worker, owner = connect(), connect()
    listener = listener_for(connect, waits_on="gone")
    listener.execute("select treadle.unlisten_done()")
    finish_one(worker, "gone")
    mark(worker, "marker-8")
    assert ("treadle_done", "gone") not in received_until(listener, "treadle_jobs", "marker-8")
    assert value(owner, "select count(*) from treadle.done_waiters") == 0

    ended = connect()
    ended_pid = value(ended, "select pg_backend_pid()")
    assert value(ended, "select treadle.listen_done('gone')") is True
    ended.close()
    while value(owner, "select count(*) from pg_stat_activity where pid = %s", (ended_pid,)):
        pass  # the backend goes a moment after the client closes
    assert value(owner, "select count(*) from treadle.done_waiters where pid = %s", (ended_pid,)) == 1
    assert value(connect(), "select treadle.listen_done('other')") is True  # removes the rows of ended sessions
    assert value(owner, "select count(*) from treadle.done_waiters where pid = %s", (ended_pid,)) == 0


def test_registering_again_keeps_one_row_per_session_and_queue(connect: Connect) -> None:
    waiter, owner = connect(), connect()
    for _ in range(3):
        assert value(waiter, "select treadle.listen_done('again')") is True
    assert value(waiter, "select treadle.listen_done()") is True
    rows = owner.execute("select queue, queue_prefix from treadle.done_waiters order by queue nulls last").fetchall()
    assert rows == [("again", ""), (None, "")]


def test_a_tenant_waiting_on_every_queue_hears_only_its_own(connect: Connect) -> None:
    owner = connect()
    owner.execute("create role notify_tenant")
    owner.execute("select treadle.grant_reader('notify_tenant')")
    owner.execute("select treadle.set_tenant('notify_tenant', 'a.')")
    listener = connect()
    listener.execute("set role notify_tenant")
    assert value(listener, "select treadle.listen_done()") is True
    listener.execute("listen treadle_done")
    listener.execute("listen treadle_jobs")
    assert row(owner, "select queue, queue_prefix from treadle.done_waiters") == (None, "a.")
    finish_one(owner, "b.other")
    finish_one(owner, "a.mine")
    mark(owner, "marker-9")
    seen = received_until(listener, "treadle_jobs", "marker-9")
    assert ("treadle_done", "a.mine") in seen
    assert ("treadle_done", "b.other") not in seen


def test_a_repeatable_read_finish_notifies_without_looking(connect: Connect) -> None:
    """Its snapshot may predate a registration, so it cannot trust what it reads of the waiters."""
    listener = listener_for(connect, waits_on=None)
    worker = connect(autocommit=False)
    worker.execute("select treadle.enqueue('x', queue => 'rr')")
    worker.commit()
    worker.execute("set transaction isolation level repeatable read")
    job_id, token = row(worker, "select id, lease_token from treadle.claim('w', array['rr'])")
    worker.execute("select treadle.complete(%s, %s)", (job_id, token))
    worker.commit()
    assert ("treadle_done", "rr") in received_until(listener, "treadle_done", "rr")


# advisory locks granted in this database (other tests run beside this one on the server)
ADVISORY_LOCKS_HERE = """
    select count(*) from pg_locks
     where locktype = 'advisory' and granted
       and database = (select oid from pg_database where datname = current_database())"""


def test_registering_waits_for_finishes_under_way(connect: Connect) -> None:
    """A finish that looked for waiters before a registration commits before the registration returns true.

    Here the finishing transaction stays open past the registration's 100 ms: the
    registration gives up waiting (false, and the session is registered all the same),
    and the finishes that follow, which see it, notify.
    """
    setup = connect()
    setup.execute("select treadle.enqueue('x', queue => 'fenced')")
    finisher = connect(autocommit=False)
    job_id, token = row(finisher, "select id, lease_token from treadle.claim('w', array['fenced'])")
    finisher.execute("select treadle.complete(%s, %s)", (job_id, token))

    waiter = connect()
    started = time.monotonic()
    assert value(waiter, "select treadle.listen_done('fenced')") is False
    assert time.monotonic() - started >= 0.09  # it waited for the finish under way
    assert value(setup, ADVISORY_LOCKS_HERE) == 1
    finisher.commit()

    assert value(waiter, "select treadle.listen_done('fenced')") is True  # nothing under way now
    waiter.execute("listen treadle_done")
    finish_one(setup, "fenced")
    assert received_until(waiter, "treadle_done", "fenced") == [("treadle_done", "fenced")]


def test_a_finish_never_waits_for_a_registration(connect: Connect) -> None:
    """While a registration holds the lock (here in a transaction left open), finishes notify without looking."""
    listener = listener_for(connect, waits_on=None)
    registering = connect(autocommit=False)
    assert value(registering, "select treadle.listen_done('elsewhere')") is True
    worker = connect()
    worker.execute("set statement_timeout = '10s'")  # a finish that waited would fail here
    finish_one(worker, "meanwhile")
    assert ("treadle_done", "meanwhile") in received_until(listener, "treadle_done", "meanwhile")
    registering.rollback()
