"""Signals consumed exactly once: many sessions that signal the same runs at the same
instant deliver (or keep) one signal per wait step, never two and never none; a signal
kept before the wait meets the step that starts the wait in either order; a signal
rolled back was never sent. Every path locks the run row first, so they take turns."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, WaitBlocked, row, value

SENDERS = 4
RUNS = 50
WAITS = Jsonb({"approve": {"signal": "go"}})


def start(conn: psycopg.Connection, queue: str, steps: list[str]) -> int:
    run_id: int = value(
        conn,
        "select treadle.start_workflow('sig', '{}', steps => %s, queue => %s, waits => %s)",
        (steps, queue, WAITS),
    )
    return run_id


def lease(conn: psycopg.Connection, queue: str, step: str) -> dict[int, tuple[int, str]]:
    """Claim the queue's available jobs of one step: run -> (job id, lease token)."""
    rows = conn.execute(
        "select workflow_run_id, id, lease_token from treadle.claim('w', array[%s], batch => 1000) where step = %s",
        (queue, step),
    ).fetchall()
    return {run_id: (job_id, token) for run_id, job_id, token in rows}


def jobs_per_step(conn: psycopg.Connection, queue: str) -> dict[tuple[int, str], int]:
    rows = conn.execute(
        "select workflow_run_id, step, count(*) from treadle.jobs where queue = %s group by 1, 2", (queue,)
    ).fetchall()
    return {(run_id, step): count for run_id, step, count in rows}


def signal_all_at_once(connect: Connect, run_ids: list[int]) -> list[list[str]]:
    """Each of SENDERS connections signals 'go' to every run, all in step (a barrier per run);
    returns each run's answers."""
    conns = [connect() for _ in range(SENDERS)]
    barrier = threading.Barrier(SENDERS)

    def send(i: int) -> list[str]:
        answers = []
        for run_id in run_ids:
            barrier.wait(60)
            answers.append(value(conns[i], "select treadle.signal(%s, 'go', %s)", (run_id, Jsonb({"from": i}))))
        return answers

    with ThreadPoolExecutor(SENDERS) as pool:
        per_sender = [f.result() for f in [pool.submit(send, i) for i in range(SENDERS)]]
    return [[answers[k] for answers in per_sender] for k in range(len(run_ids))]


def test_signals_sent_at_once_to_a_waiting_run_are_delivered_once(connect: Connect) -> None:
    setup = connect()
    run_ids = [start(setup, "sig-wait", ["approve", "ship"]) for _ in range(RUNS)]
    assert jobs_per_step(setup, "sig-wait") == {}  # every run waits, without a job
    answers = signal_all_at_once(connect, run_ids)
    assert all(sorted(a) == ["delivered"] + ["ignored"] * (SENDERS - 1) for a in answers), answers
    assert jobs_per_step(setup, "sig-wait") == {(run_id, "ship"): 1 for run_id in run_ids}
    for run_id, run_answers in zip(run_ids, answers, strict=True):
        sender = run_answers.index("delivered")
        assert value(setup, "select results -> 'approve' from treadle.workflow_runs where id = %s", (run_id,)) == {
            "from": sender
        }
    assert value(setup, "select count(*) from treadle.workflow_signals") == 0
    assert (
        value(setup, "select count(*) from treadle.workflow_runs where queue = 'sig-wait' and waiting is null") == RUNS
    )


def test_signals_sent_at_once_before_the_wait_are_kept_once_and_consumed_once(connect: Connect) -> None:
    setup = connect()
    run_ids = [start(setup, "sig-early", ["order", "approve", "ship"]) for _ in range(RUNS)]
    answers = signal_all_at_once(connect, run_ids)
    assert all(sorted(a) == ["ignored"] * (SENDERS - 1) + ["kept"] for a in answers), answers
    assert value(setup, "select count(*) from treadle.workflow_signals where queue = 'sig-early'") == RUNS
    for job_id, token in lease(setup, "sig-early", "order").values():
        assert value(setup, "select treadle.complete(%s, %s, '{}')", (job_id, token)) == "completed"
    assert jobs_per_step(setup, "sig-early") == {(run_id, step): 1 for run_id in run_ids for step in ("order", "ship")}
    for run_id, run_answers in zip(run_ids, answers, strict=True):
        assert value(setup, "select results -> 'approve' from treadle.workflow_runs where id = %s", (run_id,)) == {
            "from": run_answers.index("kept")
        }
    assert value(setup, "select count(*) from treadle.workflow_signals") == 0


def test_a_signal_waits_for_the_step_that_starts_the_wait_and_is_delivered(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    first, second = connect(autocommit=False), connect()
    run_id = start(second, "sig-turns", ["order", "approve", "ship"])
    job_id, token = lease(second, "sig-turns", "order")[run_id]
    assert value(first, "select treadle.complete(%s, %s, '{}')", (job_id, token)) == "completed"  # the wait starts
    answer: list[str] = []
    thread = threading.Thread(
        target=lambda: answer.append(value(second, "select treadle.signal(%s, 'go', '{\"n\": 1}')", (run_id,)))
    )
    thread.start()
    wait_until_blocked(second.info.backend_pid)  # on the run row that `first` holds
    first.commit()
    thread.join(60)
    assert answer == ["delivered"]
    assert jobs_per_step(second, "sig-turns") == {(run_id, "order"): 1, (run_id, "ship"): 1}
    assert value(second, "select count(*) from treadle.workflow_signals") == 0


def test_the_step_that_starts_the_wait_takes_a_signal_kept_meanwhile(
    connect: Connect, wait_until_blocked: WaitBlocked
) -> None:
    first, second = connect(autocommit=False), connect()
    run_id = start(second, "sig-kept", ["order", "approve", "ship"])
    job_id, token = lease(second, "sig-kept", "order")[run_id]
    assert value(first, "select treadle.signal(%s, 'go', '{\"n\": 2}')", (run_id,)) == "kept"
    answer: list[str] = []
    thread = threading.Thread(
        target=lambda: answer.append(value(second, "select treadle.complete(%s, %s, '{}')", (job_id, token)))
    )
    thread.start()
    wait_until_blocked(second.info.backend_pid)  # the completion waits for the signal's run row
    first.commit()
    thread.join(60)
    assert answer == ["completed"]
    assert row(second, "select results -> 'approve', waiting from treadle.workflow_runs where id = %s", (run_id,)) == (
        {"n": 2},
        None,
    )
    assert jobs_per_step(second, "sig-kept") == {(run_id, "order"): 1, (run_id, "ship"): 1}
    assert value(second, "select count(*) from treadle.workflow_signals") == 0


def test_a_signal_rolled_back_was_never_sent(connect: Connect) -> None:
    conn = connect(autocommit=False)
    waiting = start(conn, "sig-undo", ["approve", "ship"])
    early = start(conn, "sig-undo", ["order", "approve", "ship"])
    conn.commit()
    assert value(conn, "select treadle.signal(%s, 'go')", (waiting,)) == "delivered"
    assert value(conn, "select treadle.signal(%s, 'go')", (early,)) == "kept"
    conn.rollback()
    assert row(conn, "select results, waiting ? 'approve' from treadle.workflow_runs where id = %s", (waiting,)) == (
        {},
        True,
    )
    assert jobs_per_step(conn, "sig-undo") == {(early, "order"): 1}
    assert value(conn, "select count(*) from treadle.workflow_signals") == 0
    # and sent again, it is delivered then
    assert value(conn, "select treadle.signal(%s, 'go')", (waiting,)) == "delivered"
    conn.commit()
    assert jobs_per_step(conn, "sig-undo") == {(early, "order"): 1, (waiting, "ship"): 1}
