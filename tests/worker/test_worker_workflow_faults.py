"""Fault injection on workflow runs that use every feature (issue 23, "Guarantees to prove").

Real worker processes (workflow_fault_worker.py) run a graph with parallel branches and a
join, a map over 20 elements, a sleep step, a signal wait, a child run, and a failing run
that compensates, while the test SIGKILLs workers mid-step, terminates their backends, or
restarts PostgreSQL. Then, from the tables: no run lost (each ends completed, or
compensated as designed), no step completed twice (each handler writes its completion row
in the transaction of its completion, so a second row is a rerun after completion), one
join job per run, one job per map element, each signal consumed once, and the sleep ended
by treadle's clock, never early.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.markers import marks_users
from tests.worker.test_worker_faults import PGCLUSTER, pgcluster, start_cluster
from tests.worker.worker_support import EFFECTS_TABLE, HERE, PATIENCE, Child, run, until_registered, wait_for
from treadle import client

WORKER = HERE / "workflow_fault_worker.py"
ELEMENTS = list(range(20))
EVERYTHING = {"start", "left", "right", "each", "nap", "approve", "kid", "join"}
COMPLETIONS_TABLE = """
CREATE TABLE completions (
    id      bigserial PRIMARY KEY,
    run_id  bigint NOT NULL,
    step    text NOT NULL,
    element integer,
    attempt integer NOT NULL,
    job_id  bigint NOT NULL,
    worker  text NOT NULL
)
"""

KILLS_TABLE = "CREATE TABLE kills (point text PRIMARY KEY, worker text NOT NULL)"
# where workers SIGKILL themselves (workflow_fault_worker.py), once each: inside a branch,
# a map element, the join, a child run's step, a compensation; and just after the
# completion of others committed, before their handler returned
KILL_PLAN = [
    "after:start",
    "mid:right",
    "after:left",
    "mid:each/7",
    "after:each/3",
    "mid:k1",
    "after:k2",
    "mid:join",
    "after:join",
    "after:reserve",
    "mid:refund",
    "after:release",
]

Spawn = Callable[..., Child]


class Fleet:
    """Worker processes under one DSN; a dead one is replaced by a new one (a new id)."""

    def __init__(self, spawn: Spawn, dsn: str, size: int, **settings: Any) -> None:
        self.spawn, self.dsn, self.settings = spawn, dsn, settings
        self.started = 0
        self.workers: dict[str, Child] = {}
        self.deaths = 0
        for _ in range(size):
            self.add()

    def add(self) -> None:
        self.started += 1
        name = f"w{self.started}"
        self.workers[name] = self.spawn(self.dsn, name, **self.settings)

    def replace_dead(self) -> None:
        for name, child in list(self.workers.items()):
            if child.process.poll() is not None:
                assert child.process.returncode == -signal.SIGKILL, child.log()
                del self.workers[name]
                self.deaths += 1
                self.add()

    def kill(self, name: str) -> None:
        self.workers[name].signal(signal.SIGKILL)
        self.workers[name].wait_exit()


@pytest.fixture
@marks_users(pytest.mark.subprocess)
def spawn_wf(tmp_path: Path) -> Iterator[Spawn]:
    """Start workflow_fault_worker.py processes on a DSN; any still alive are killed after the test."""
    children: list[Child] = []

    def start(dsn: str, worker_id: str, **settings: Any) -> Child:
        child = Child(dsn, worker_id, "none", tmp_path, script=WORKER, **settings)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()


def prepare(conn: psycopg.Connection[Any]) -> None:
    conn.execute(EFFECTS_TABLE)
    conn.execute(COMPLETIONS_TABLE)
    conn.execute(KILLS_TABLE)


def start_runs(conn: psycopg.Connection[Any], everything: int, doomed: int) -> tuple[list[int], list[int]]:
    """Runs of both workflows (registered by a worker that has started)."""

    def start(name: str, n: int) -> int:
        row = conn.execute("SELECT treadle.start_workflow(%s, %s)", [name, Jsonb({"n": n})]).fetchone()
        assert row is not None
        return int(row[0])

    return [start("everything", n) for n in range(everything)], [start("doomed", n) for n in range(doomed)]


def signal_runs(dsn: str, runs: list[int]) -> None:
    """Each run's signal, from a connection of its own (some arrive before the wait is ready: kept)."""
    with psycopg.connect(dsn, autocommit=True) as other:
        for run_id in runs:
            assert client.signal(other, run_id, "approved", {"approved": run_id}) in ("kept", "delivered")


def work_left(conn: psycopg.Connection[Any], everything: list[int], doomed: list[int]) -> bool:
    """True until every run has all it can have before its sleep ends: everything but nap."""
    for run_id in everything:
        if set(run(conn, run_id)["results"] or {}) != EVERYTHING - {"nap"}:
            return True
    return any(run(conn, run_id)["state"] in ("running", "compensating") for run_id in doomed)


def end_sleeps(conn: psycopg.Connection[Any], everything: list[int]) -> None:
    """Move treadle's clock (this session's) past the sleeps: a rescue a minute early ends
    none; one just past their wake times ends them all (each step's result is its wake
    time), and the runs complete then."""
    wakes = [run(conn, run_id)["wake_at"] for run_id in everything]
    assert all(wakes), "each run sleeps"
    early, late = min(wakes) - timedelta(minutes=1), max(wakes) + timedelta(seconds=1)
    conn.execute("SELECT set_config('treadle.now', %s, false)", [early.isoformat()])
    conn.execute("SELECT treadle.rescue()")
    assert all("nap" not in run(conn, run_id)["results"] for run_id in everything), "a sleep ended early"
    conn.execute("SELECT set_config('treadle.now', %s, false)", [late.isoformat()])
    conn.execute("SELECT treadle.rescue()")
    conn.execute("SELECT set_config('treadle.now', '', false)")
    for run_id, wake in zip(everything, wakes, strict=True):
        woke = run(conn, run_id)
        assert woke["state"] == "completed" and woke["finished_at"] == late
        assert datetime.fromisoformat(woke["results"]["nap"]) == wake


def check_outcome(conn: psycopg.Connection[Any], everything: list[int], doomed: list[int]) -> None:
    expected: list[tuple[int, str, int | None]] = []
    runs: list[int] = list(doomed)
    for run_id in everything:
        done = run(conn, run_id)
        assert done["state"] == "completed", done
        results = done["results"]
        assert set(results) == EVERYTHING
        assert results["start"] == ELEMENTS
        assert results["each"] == [10 * e for e in ELEMENTS]
        assert results["join"] == ["each", "left", "right", "start"]
        assert results["approve"] == {"approved": run_id}, "the run's own signal, once"
        assert set(results["kid"]) == {"k1", "k2"}
        (kid,) = conn.execute(
            "SELECT id, state FROM treadle.workflow_runs WHERE parent_run_id = %s", [run_id]
        ).fetchall()
        assert kid[1] == "completed"
        expected += [(run_id, s, None) for s in ("start", "left", "right", "join")]
        expected += [(run_id, "each", e) for e in ELEMENTS]
        expected += [(kid[0], "k1", None), (kid[0], "k2", None)]
        runs += [run_id, kid[0]]
    for run_id in doomed:
        done = run(conn, run_id)
        assert done["state"] == "compensated", done
        assert set(done["results"]) >= {"reserve", "debit", "release", "refund"}
        expected += [(run_id, s, None) for s in ("reserve", "debit", "release", "refund")]
    jobs = conn.execute(
        "SELECT workflow_run_id, step, (args->>'index')::int, count(*) FROM treadle.jobs"
        " WHERE workflow_run_id = ANY (%s) GROUP BY 1, 2, 3 HAVING count(*) > 1",
        [runs],
    ).fetchall()
    assert jobs == [], "one job per step of a run (one join, one per map element)"
    joins = conn.execute(
        "SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = ANY (%s) AND step = 'join'", [everything]
    ).fetchone()
    assert joins == (len(everything),), "one join job per run"
    rows = conn.execute("SELECT run_id, step, element, count(*) FROM completions GROUP BY 1, 2, 3").fetchall()
    twice = [row for row in rows if row[3] != 1]
    assert twice == [], "a step completed more than once"
    assert sorted((r, s, e) for r, s, e, _ in rows if e is None) == sorted(x for x in expected if x[2] is None)
    assert sorted((r, s, e) for r, s, e, _ in rows if e is not None) == sorted(x for x in expected if x[2] is not None)
    assert conn.execute("SELECT count(*) FROM treadle.workflow_signals").fetchone() == (0,), "no signal left over"


def reruns(conn: psycopg.Connection[Any]) -> int:
    """Handler runs that did not complete: the faults' traces."""
    row = conn.execute("SELECT (SELECT count(*) FROM effects) - (SELECT count(*) FROM completions)").fetchone()
    assert row is not None
    return int(row[0])


def mid_step(conn: psycopg.Connection[Any], live: list[str]) -> str | None:
    """A live worker running a step whose handler has started (its 'ran' row for this attempt)."""
    row = conn.execute(
        "SELECT j.worker_id FROM treadle.jobs AS j JOIN effects AS e ON e.job_id = j.id AND e.attempt = j.attempt"
        " WHERE j.state = 'running' AND j.worker_id = ANY (%s) LIMIT 1",
        [live],
    ).fetchone()
    return None if row is None else str(row[0])


def test_workers_sigkilled_mid_step_lose_no_run_and_rerun_no_completed_step(
    conn: psycopg.Connection[Any], dsn: str, spawn_wf: Spawn
) -> None:
    """Workers die at each point of KILL_PLAN, and the test SIGKILLs two more mid-step;
    each dead worker is replaced, and the new ones rescue what the dead held."""
    prepare(conn)
    fleet = Fleet(spawn_wf, dsn, 3, kills=",".join(KILL_PLAN))
    until_registered(conn, "w1")
    everything, doomed = start_runs(conn, everything=3, doomed=2)
    signal_runs(dsn, everything[:1])  # before its wait is ready: kept
    killed = 0
    deadline = time.monotonic() + PATIENCE
    while work_left(conn, everything, doomed):
        assert time.monotonic() < deadline, "the runs did not reach their sleeps or ends in time"
        fleet.replace_dead()
        if killed < 2 and (victim := mid_step(conn, list(fleet.workers))):
            fleet.kill(victim)
            killed += 1
            if killed == 2:
                signal_runs(dsn, everything[1:])
        time.sleep(0.05)
    if killed < 2:
        signal_runs(dsn, everything[1:])
    print(
        f"{fleet.deaths} workers died ({killed} killed by the test mid-step), {reruns(conn)} handler runs not completed"
    )
    fired = [point for (point,) in conn.execute("SELECT point FROM kills ORDER BY point")]
    assert fired == sorted(KILL_PLAN), "every kill point was reached"
    assert reruns(conn) >= 2, "the faults hit running steps"
    end_sleeps(conn, everything)
    check_outcome(conn, everything, doomed)


def test_terminated_backends_lose_no_run_and_rerun_no_completed_step(
    conn: psycopg.Connection[Any], dsn: str, spawn_wf: Spawn
) -> None:
    """Every backend of the workers, their handlers' connections included, terminated again and again."""
    prepare(conn)
    for name in ("w1", "w2"):
        spawn_wf(dsn, name)
    until_registered(conn, "w1")
    everything, doomed = start_runs(conn, everything=3, doomed=2)
    terminated = 0
    for sweep in range(6):
        if not work_left(conn, everything, doomed):
            break
        wait_for(lambda: mid_step(conn, ["w1", "w2"]), "a worker mid-step")
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity, pg_terminate_backend(pid)"
            " WHERE datname = current_database()"  # other tests' workers share the server
            " AND (application_name LIKE 'treadle-worker:%' OR application_name LIKE 'treadle-step:%')"
        ).fetchone()
        assert row is not None
        terminated += row[0]
        if sweep == 1:
            signal_runs(dsn, everything)
        time.sleep(0.3)
    wait_for(lambda: not work_left(conn, everything, doomed), "every run to reach its sleep or its end")
    print(f"{terminated} backends terminated, {reruns(conn)} handler runs not completed")
    assert terminated >= 6 and reruns(conn) >= 1, "the faults hit running steps"
    end_sleeps(conn, everything)
    check_outcome(conn, everything, doomed)


def test_a_server_restart_mid_run_loses_no_run_and_reruns_no_completed_step(tmp_path: Path, spawn_wf: Spawn) -> None:
    cluster = tmp_path / "restarted"
    url = start_cluster(cluster)
    port = url.rsplit(":", 1)[1].split("/")[0]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION treadle")
            prepare(conn)
            # longer steps: the restart finds some mid-step
            spawn_wf(url, "w1", step_seconds=0.5)
            spawn_wf(url, "w2", step_seconds=0.5)
            until_registered(conn, "w1")
            everything, doomed = start_runs(conn, everything=2, doomed=1)
            wait_for(lambda: mid_step(conn, ["w1", "w2"]), "a worker mid-step")
        pgcluster("stop", cluster)
        pgcluster("start", cluster, port)
        with psycopg.connect(url, autocommit=True) as conn:
            signal_runs(url, everything)
            wait_for(lambda: not work_left(conn, everything, doomed), "every run to reach its sleep or its end")
            print(f"{reruns(conn)} handler runs not completed")
            assert reruns(conn) >= 1, "the restart hit running steps"
            end_sleeps(conn, everything)
            check_outcome(conn, everything, doomed)
    finally:
        subprocess.run([PGCLUSTER, "stop", cluster], check=False, timeout=120)
