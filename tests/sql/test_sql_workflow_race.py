"""A workflow step finished by a slow worker while a rescue and a re-claim race it:
whoever wins, each step of a run is one job, so no step is ever enqueued twice."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from tests.sql.sqlcalls import Connect, WaitBlocked, row, value

RUNS = 40
STEPS = ["fetch", "parse", "store"]


def jobs_per_step(conn: psycopg.Connection) -> list[tuple[int, str, int]]:
    return conn.execute(
        "select workflow_run_id, step, count(*) from treadle.jobs group by 1, 2 order by 1, 2"
    ).fetchall()


def test_rescue_then_reclaim_while_the_slow_worker_completes(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    """Ordered by locks: the rescue commits first, the slow complete is refused, the new claimer advances the run."""
    slow, rescuer, other = connect(), connect(autocommit=False), connect()
    run_id = value(slow, "select treadle.start_workflow('etl', steps => %s, queue => 'etl')", (STEPS,))
    step_id, old_token = row(slow, "select id, lease_token from treadle.claim('slow', array['etl'])")

    ahead = "select set_config('treadle.now', (now() + interval '1 hour')::text, false)"
    rescuer.execute(ahead)
    assert rescuer.execute("select treadle.rescue()").fetchone() == (1,)
    answer: list[Any] = []
    thread = threading.Thread(
        target=lambda: answer.append(
            slow.execute("select treadle.complete(%s, %s, '1')", (step_id, old_token)).fetchone()
        )
    )
    thread.start()
    wait_until_blocked(slow.info.backend_pid)
    rescuer.commit()
    thread.join(60)
    assert answer == [(None,)]

    other.execute(ahead)  # the rescued step is due at the rescuer's time
    new = other.execute("select id, lease_token from treadle.claim('other', array['etl'])").fetchone()
    assert new is not None and new[0] == step_id
    assert other.execute("select treadle.complete(%s, %s, '2')", (step_id, new[1])).fetchone() == ("completed",)
    assert slow.execute("select treadle.complete(%s, %s, '1')", (step_id, old_token)).fetchone() == (None,)

    assert jobs_per_step(slow) == [(run_id, "fetch", 1), (run_id, "parse", 1)]
    assert slow.execute("select treadle.workflow_results(%s)", (run_id,)).fetchone() == ({"fetch": 2},)


def test_the_slow_complete_commits_first_and_the_rescue_finds_nothing(connect: Connect) -> None:
    slow, rescuer = connect(autocommit=False), connect()
    run_id = value(slow, "select treadle.start_workflow('etl', steps => %s, queue => 'etl')", (STEPS,))
    step_id, token = row(slow, "select id, lease_token from treadle.claim('slow', array['etl'])")
    slow.commit()
    assert slow.execute("select treadle.complete(%s, %s, '1')", (step_id, token)).fetchone() == ("completed",)
    rescuer.execute("select set_config('treadle.now', (now() + interval '1 hour')::text, false)")
    assert rescuer.execute("select treadle.rescue()").fetchone() == (0,)
    slow.commit()
    assert rescuer.execute("select treadle.rescue()").fetchone() == (0,)
    assert jobs_per_step(rescuer) == [(run_id, "fetch", 1), (run_id, "parse", 1)]


def test_many_runs_raced_at_once_never_enqueue_a_step_twice(connect: Connect) -> None:
    """Real one-second leases expire; then for every run a slow worker completes with its old
    token while a rescuer and a second worker race it. Either order is fine; a duplicate is not."""
    setup = connect()
    run_ids = [
        value(setup, "select treadle.start_workflow('etl', steps => %s, queue => 'race')", (STEPS,))
        for _ in range(RUNS)
    ]
    leases = setup.execute(
        "select id, lease_token from treadle.claim('slow', array['race'], batch => 1000, lease => '1 second')"
    ).fetchall()
    assert len(leases) == RUNS
    # let every lease expire (by the database's clock), so the race below is real
    while setup.execute(
        "select count(*) from treadle.jobs where state = 'running' and lease_until >= clock_timestamp()"
    ).fetchone() != (0,):
        time.sleep(0.1)

    slow_conns = [connect() for _ in range(4)]
    rescuer, other = connect(), connect()
    start = threading.Barrier(len(slow_conns) + 2)

    under_way = threading.Event()  # the rescuer joins in once the slow workers are under way

    def slow_worker(i: int) -> list[str | None]:
        start.wait()
        conn = slow_conns[i]
        answers = []
        for job_id, token in leases[i :: len(slow_conns)]:
            answers.append(value(conn, "select treadle.complete(%s, %s, '\"slow\"')", (job_id, token)))
            if len(answers) == 2:
                under_way.set()
        return answers

    def rescue() -> int:
        start.wait()
        under_way.wait(60)
        return sum(value(rescuer, "select treadle.rescue()") for _ in range(20))

    def second_worker() -> int:
        start.wait()
        done = 0
        for _ in range(20):
            for job_id, token in other.execute(
                "select id, lease_token from treadle.claim('other', array['race'], batch => 10)"
            ).fetchall():
                state = other.execute("select treadle.complete(%s, %s, '\"other\"')", (job_id, token)).fetchone()
                assert state == ("completed",)
                done += 1
        return done

    with ThreadPoolExecutor(len(slow_conns) + 2) as pool:
        slow_results = [pool.submit(slow_worker, i) for i in range(len(slow_conns))]
        rescued = pool.submit(rescue)
        pool.submit(second_worker).result()
        slow_answers = [a for f in slow_results for a in f.result()]
        rescued_count = rescued.result()

    assert set(slow_answers) <= {"completed", None}
    # every first step was finished exactly once: by the slow worker, or after a rescue
    assert slow_answers.count("completed") + rescued_count == RUNS

    # drive every run to its end
    while True:
        rows = setup.execute(
            "select id, lease_token from treadle.claim('finisher', array['race'], batch => 100)"
        ).fetchall()
        if not rows:
            break
        for job_id, token in rows:
            assert setup.execute("select treadle.complete(%s, %s)", (job_id, token)).fetchone() == ("completed",)

    expected = [(run_id, step, 1) for run_id in sorted(run_ids) for step in sorted(STEPS)]
    assert jobs_per_step(setup) == expected
    states = setup.execute("select state, count(*) from treadle.workflow_runs group by state").fetchall()
    assert states == [("completed", RUNS)]
    assert setup.execute("select count(*) from treadle.jobs where state <> 'completed'").fetchone() == (0,)


def test_cancel_workflow_racing_workers_ends_every_run_cleanly(connect: Connect) -> None:
    """Workers advance runs while another session cancels each of them once: a run ends
    cancelled exactly when cancel_workflow said true, and no run is left with a stray step."""
    setup = connect()
    run_ids = [
        value(setup, "select treadle.start_workflow('etl', steps => %s, queue => 'cancel-race')", (STEPS,))
        for _ in range(RUNS)
    ]
    workers = [connect() for _ in range(3)]
    canceller = connect()
    start = threading.Barrier(len(workers) + 1)

    def work(conn: psycopg.Connection) -> None:
        start.wait()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = conn.execute(
                "select id, lease_token from treadle.claim('w', array['cancel-race'], batch => 3)"
            ).fetchall()
            for job_id, token in rows:
                state = conn.execute("select treadle.complete(%s, %s)", (job_id, token)).fetchone()
                assert state in {("completed",), ("cancelled",)}
            if not rows and conn.execute(
                "select count(*) from treadle.workflow_runs where state = 'running'"
            ).fetchone() == (0,):
                return
        raise AssertionError("runs never settled")

    def cancel_each() -> dict[int, bool]:
        start.wait()
        said = {}
        for run_id in reversed(run_ids):
            said[run_id] = value(canceller, "select treadle.cancel_workflow(%s)", (run_id,))
        return said

    with ThreadPoolExecutor(len(workers) + 1) as pool:
        done = [pool.submit(work, conn) for conn in workers]
        said = pool.submit(cancel_each).result()
        for future in done:
            future.result()

    states: dict[int, str] = dict(setup.execute("select id, state from treadle.workflow_runs").fetchall())
    assert {run_id: states[run_id] == "cancelled" for run_id in run_ids} == said
    assert set(states.values()) <= {"completed", "cancelled"}
    assert setup.execute(
        "select count(*) from treadle.jobs where state in ('available', 'retryable', 'running')"
    ).fetchone() == (0,)
    for run_id, step, count in jobs_per_step(setup):
        assert count == 1, (run_id, step)
    # a cancelled run stopped at its first unfinished step: one job per step up to there
    for run_id in run_ids:
        steps = [
            s
            for (s,) in setup.execute("select step from treadle.jobs where workflow_run_id = %s order by id", (run_id,))
        ]
        assert steps == STEPS[: len(steps)]
