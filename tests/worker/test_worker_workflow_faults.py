"""Fault injection on workflow runs that use every feature (issue 23, "Guarantees to prove").

Real worker processes (workflow_fault_worker.py) run a graph with parallel branches and a
join, a map over 20 elements, a sleep step, a signal wait, a child run, and a failing run
that compensates; and "ledger" runs whose steps have their own options (another queue, a
priority, max_attempts, a concurrency key), one of which sleeps in its handler
(ctx.sleep), that wait for a signal sent by business key, and fail on purpose: the test
retries one (retry_run) and forks the other from a middle step (fork_run) while the faults
go on. The test SIGKILLs workers mid-step, terminates their backends, or restarts
PostgreSQL. Then, from the tables: no run lost (each ends completed, or compensated as
designed, or failed for the forked one), no step completed twice (each handler writes its
completion row in the transaction of its completion, so a second row is a rerun after
completion), no step that completed before a retry or a fork ran again (nor, in the fork,
at all), one join job per run, one job per map element, each signal consumed once, the
step options held, and the sleeps ended by treadle's clock, never early.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.markers import marks_users
from tests.worker.test_worker_faults import PGCLUSTER, pgcluster, start_cluster
from tests.worker.worker_support import (
    EFFECTS_TABLE,
    HERE,
    PATIENCE,
    Child,
    run,
    run_steps,
    until_registered,
    wait_for,
)
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
    worker  text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
# the ledger runs the test has repaired: their settle step no longer fails
REPAIRED_TABLE = "CREATE TABLE repaired (run_id bigint PRIMARY KEY)"

LEDGER = {"doze", "cleared", "side", "lane", "settle", "close"}
BEFORE_SETTLE = LEDGER - {"settle", "close"}  # what a broken ledger run completes before it fails
FORKED_AT = "side"
FORK_RUNS = {"side", "settle", "close"}  # what a fork from side runs: the others it carries
DOZE = timedelta(seconds=0.3)  # the doze handler's ctx.sleep (workflow_fault_worker.py)
LEDGER_PRIORITY = -1  # the ledger runs' steps go first: their retry and fork come early
# the job options of each ledger step that has a handler: (queue, priority, max_attempts, concurrency_key)
LEDGER_OPTIONS = {
    "doze": ("default", LEDGER_PRIORITY, 25, None),
    "side": ("side", 7, 25, None),
    "lane": ("default", LEDGER_PRIORITY, 25, "ledger-lane"),
    "settle": ("default", LEDGER_PRIORITY, 10, None),
    "close": ("default", LEDGER_PRIORITY, 25, None),
}

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
    # in a ledger run, a handler's sleep recorded but not yet snoozed; then in the retried
    # run and in the fork, after the retry and the fork
    "slept:doze",
    "after:settle",
    "mid:close",
    "mid:side@fork",
    "after:settle@fork",
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
    conn.execute(REPAIRED_TABLE)


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


def ledger_key(n: int) -> str:
    return f"ledger-{n}"


def trace(conn: psycopg.Connection[Any], run_id: int, steps: Iterable[str]) -> list[tuple[Any, ...]]:
    """The run's jobs of `steps`, each with its state, attempt and handler runs (its rows in
    `effects`): a step that runs again, or is enqueued again, changes it."""
    return conn.execute(
        "SELECT j.id, j.step, j.state, j.attempt,"
        " array(SELECT e.id FROM effects AS e WHERE e.job_id = j.id ORDER BY e.id)"
        " FROM treadle.jobs AS j WHERE j.workflow_run_id = %s AND j.step = ANY (%s) ORDER BY j.id",
        [run_id, sorted(steps)],
    ).fetchall()


@dataclass
class Snapshot:
    """A ledger run as it stood when it had failed at settle."""

    results: dict[str, Any]
    trace: list[tuple[Any, ...]]


def failed_at_settle(conn: psycopg.Connection[Any], run_id: int) -> Snapshot:
    """The run failed where it was made to: every step before settle completed, settle
    discarded, close never enqueued."""
    failed = run(conn, run_id)
    assert failed["state"] == "failed" and set(failed["results"]) == BEFORE_SETTLE, failed
    jobs = {s["step"]: s for s in run_steps(conn, run_id)}
    assert set(jobs) == LEDGER - {"cleared", "close"}
    assert jobs["settle"]["state"] == "discarded" and "out of balance" in jobs["settle"]["last_error"]
    return Snapshot(failed["results"], trace(conn, run_id, LEDGER))


class Ledgers:
    """Two runs of "ledger", started with idempotency keys and broken: each fails at settle.
    As soon as they have failed, the test repairs the first and retries it (retry_run), and
    forks the second from side with an input that is not broken (fork_run)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.retried, self.source = (self._start(conn, n) for n in range(2))
        self.at_retry: Snapshot | None = None
        self.at_fork: Snapshot | None = None
        self.fork: int | None = None

    @staticmethod
    def _start(conn: psycopg.Connection[Any], n: int) -> int:
        row = conn.execute(
            "SELECT treadle.start_workflow('ledger', %s, priority => %s, idempotency_key => %s)",
            [Jsonb({"n": n, "broken": True}), LEDGER_PRIORITY, ledger_key(n)],
        ).fetchone()
        assert row is not None
        return int(row[0])

    def signal(self, dsn: str, *numbers: int) -> None:
        """The signal "cleared" to the runs numbered `numbers`, by their idempotency keys."""
        with psycopg.connect(dsn, autocommit=True) as other:
            for n in numbers:
                sent = client.signal_by_key(other, "default", ledger_key(n), "cleared", {"cleared": ledger_key(n)})
                assert sent in ("kept", "delivered")

    def operate(self, conn: psycopg.Connection[Any]) -> bool:
        """Retry the first and fork the second, each once it has failed; True once both are done."""
        if self.at_retry is None and run(conn, self.retried)["state"] == "failed":
            self.at_retry = failed_at_settle(conn, self.retried)
            conn.execute("INSERT INTO repaired (run_id) VALUES (%s)", [self.retried])
            assert client.retry_run(conn, self.retried) == "running"
        if self.fork is None and run(conn, self.source)["state"] == "failed":
            self.at_fork = failed_at_settle(conn, self.source)
            self.fork = client.fork_run(conn, self.source, FORKED_AT, input={"n": 1, "forked": True})
        return self.at_retry is not None and self.fork is not None

    def operated(self) -> list[int]:
        """The runs retried or started by a fork so far."""
        return ([self.retried] if self.at_retry else []) + ([self.fork] if self.fork else [])

    def runs(self) -> list[int]:
        return [self.retried, self.source] + ([self.fork] if self.fork else [])

    def done(self, conn: psycopg.Connection[Any]) -> bool:
        """The retried run and the fork have completed."""
        return self.fork is not None and all(run(conn, run_id)["state"] == "completed" for run_id in self.operated())

    def check(self, conn: psycopg.Connection[Any]) -> list[tuple[int, str, int | None]]:
        """The ledger runs' ends; returns the completions they must have logged."""
        assert self.at_retry is not None and self.at_fork is not None and self.fork is not None
        retried = run(conn, self.retried)
        assert retried["state"] == "completed" and set(retried["results"]) == LEDGER, retried
        assert {s: retried["results"][s] for s in BEFORE_SETTLE} == self.at_retry.results
        assert trace(conn, self.retried, BEFORE_SETTLE) == [
            job for job in self.at_retry.trace if job[1] in BEFORE_SETTLE
        ], "a step completed before the retry ran again"
        source = run(conn, self.source)
        assert (source["state"], source["results"]) == ("failed", self.at_fork.results), "the fork changed its source"
        assert trace(conn, self.source, LEDGER) == self.at_fork.trace, "the fork changed its source"
        fork = run(conn, self.fork)
        assert (fork["state"], fork["forked_from"], fork["forked_step"]) == ("completed", self.source, FORKED_AT), fork
        assert set(fork["results"]) == LEDGER
        carried = LEDGER - FORK_RUNS
        assert {s: fork["results"][s] for s in carried} == {s: source["results"][s] for s in carried}
        assert sorted(s["step"] for s in run_steps(conn, self.fork)) == sorted(FORK_RUNS), "the fork ran a carried step"
        for n, run_id in enumerate((self.retried, self.source)):
            assert run(conn, run_id)["results"]["cleared"] == {"cleared": ledger_key(n)}, "the signal sent by key"
        check_step_options(conn, self.runs())
        check_handler_sleeps(conn, [self.retried, self.source])
        check_lane(conn, [self.retried, self.source])
        handlers = LEDGER - {"cleared"}
        logged: list[tuple[int, str, int | None]] = [(self.retried, s, None) for s in handlers]
        logged += [(self.source, s, None) for s in handlers - {"settle", "close"}]
        logged += [(self.fork, s, None) for s in FORK_RUNS]
        return logged


def check_step_options(conn: psycopg.Connection[Any], runs: list[int]) -> None:
    """Every job of a ledger step took that step's options: its first, its retried and its forked ones."""
    rows = conn.execute(
        "SELECT DISTINCT step, queue, priority, max_attempts, concurrency_key FROM treadle.jobs"
        " WHERE workflow_run_id = ANY (%s)",
        [runs],
    ).fetchall()
    assert sorted(rows, key=str) == sorted(((step, *options) for step, options in LEDGER_OPTIONS.items()), key=str)


def check_handler_sleeps(conn: psycopg.Connection[Any], runs: list[int]) -> None:
    """Each doze handler recorded one wake time, and did its work once that time had passed,
    never early. A pass that ended in a snooze ('snoozed') recorded it, and the later passes,
    the one after a worker killed before its snooze among them, read it back: a wake time
    recorded anew would be later."""
    snoozes = 0
    for run_id in runs:
        (job,) = [s for s in run_steps(conn, run_id) if s["step"] == "doze"]
        sleeps = run(conn, run_id)["step_sleeps"]
        assert list(sleeps) == [str(job["id"])] and len(sleeps[str(job["id"])]) == 1, sleeps
        wake = datetime.fromisoformat(sleeps[str(job["id"])][0])
        row = conn.execute(
            "SELECT min(at) FILTER (WHERE what = 'snoozed'), min(at) FILTER (WHERE what = 'ran')"
            " FROM effects WHERE job_id = %s",
            [job["id"]],
        ).fetchone()
        assert row is not None
        snoozed, worked = row
        # no 'snoozed' row when a fault ended the first pass before it and the next came after the wake time
        if snoozed is not None:
            snoozes += 1
            assert wake < snoozed + DOZE, "the wake time was recorded anew"
        assert worked >= wake, "the handler went past its sleep early"
    assert snoozes >= 1, "no handler's sleep ended its attempt"


def check_lane(conn: psycopg.Connection[Any], runs: list[int]) -> None:
    """The lane steps (one concurrency key, the queue's limit 1) ran one at a time across the
    runs: each completed attempt, from its 'ran' row to its completion, apart from the other."""
    spans = conn.execute(
        "SELECT e.at, c.at FROM completions AS c"
        " JOIN effects AS e ON e.job_id = c.job_id AND e.attempt = c.attempt AND e.what = 'ran'"
        " WHERE c.step = 'lane' AND c.run_id = ANY (%s) ORDER BY e.at",
        [runs],
    ).fetchall()
    assert len(spans) == len(runs)
    for (_, ended), (started, _) in pairwise(spans):
        assert ended < started, "two steps of one concurrency key ran at once"


def work_left(conn: psycopg.Connection[Any], everything: list[int], doomed: list[int], ledgers: Ledgers) -> bool:
    """True until every run has all it can have before its sleep ends: everything but nap;
    and until the ledger runs are retried and forked, and those have completed."""
    for run_id in everything:
        if set(run(conn, run_id)["results"] or {}) != EVERYTHING - {"nap"}:
            return True
    if any(run(conn, run_id)["state"] in ("running", "compensating") for run_id in doomed):
        return True
    return not ledgers.done(conn)


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


def check_outcome(conn: psycopg.Connection[Any], everything: list[int], doomed: list[int], ledgers: Ledgers) -> None:
    expected: list[tuple[int, str, int | None]] = ledgers.check(conn)
    runs: list[int] = list(doomed) + ledgers.runs()
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


def reruns(conn: psycopg.Connection[Any], runs: list[int] | None = None) -> int:
    """Handler runs that did not complete, the failures made on purpose aside: the faults'
    traces (in `runs` only, when given)."""
    row = conn.execute(
        "SELECT count(*) FROM effects AS e JOIN treadle.jobs AS j ON j.id = e.job_id"
        " WHERE e.what = 'ran' AND (%(runs)s::bigint[] IS NULL OR j.workflow_run_id = ANY (%(runs)s))"
        " AND NOT EXISTS (SELECT FROM completions AS c WHERE c.job_id = e.job_id AND c.attempt = e.attempt)",
        {"runs": runs},
    ).fetchone()
    assert row is not None
    return int(row[0])


def mid_step(
    conn: psycopg.Connection[Any], live: list[str], runs: list[int] | None = None, within: float | None = None
) -> str | None:
    """A live worker running a step whose handler has started (its 'ran' row for this
    attempt), in `runs` when given, and at most `within` seconds ago when given."""
    row = conn.execute(
        "SELECT j.worker_id FROM treadle.jobs AS j JOIN effects AS e ON e.job_id = j.id AND e.attempt = j.attempt"
        " WHERE e.what = 'ran' AND j.state = 'running' AND j.worker_id = ANY (%(live)s)"
        " AND (%(runs)s::bigint[] IS NULL OR j.workflow_run_id = ANY (%(runs)s))"
        " AND (%(within)s::float8 IS NULL OR e.at > clock_timestamp() - make_interval(secs => %(within)s)) LIMIT 1",
        {"live": live, "runs": runs, "within": within},
    ).fetchone()
    return None if row is None else str(row[0])


def in_flight(conn: psycopg.Connection[Any], moments: list[datetime], runs: list[int] | None = None) -> int:
    """Handler runs under way at one of `moments` (begun before it and not completed by
    then): the steps a fault hit, whether they completed later or ran again (in `runs`
    only, when given)."""
    row = conn.execute(
        "SELECT count(*) FROM effects AS e JOIN treadle.jobs AS j ON j.id = e.job_id"
        " WHERE e.what = 'ran' AND (%(runs)s::bigint[] IS NULL OR j.workflow_run_id = ANY (%(runs)s))"
        " AND EXISTS (SELECT FROM unnest(%(moments)s::timestamptz[]) AS m (at) WHERE e.at < m.at AND NOT EXISTS"
        " (SELECT FROM completions AS c WHERE c.job_id = e.job_id AND c.attempt = e.attempt AND c.at < m.at))",
        {"runs": runs, "moments": moments},
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_workers_sigkilled_mid_step_lose_no_run_and_rerun_no_completed_step(
    conn: psycopg.Connection[Any], dsn: str, spawn_wf: Spawn
) -> None:
    """Workers die at each point of KILL_PLAN, and the test SIGKILLs two more mid-step;
    each dead worker is replaced, and the new ones rescue what the dead held. Some points
    are in the retried ledger run after its retry, and in the fork."""
    prepare(conn)
    fleet = Fleet(spawn_wf, dsn, 3, kills=",".join(KILL_PLAN))
    until_registered(conn, "w1")
    everything, doomed = start_runs(conn, everything=3, doomed=2)
    ledgers = Ledgers(conn)
    signal_runs(dsn, everything[:1])  # before its wait is ready: kept
    ledgers.signal(dsn, 0)
    killed = 0
    deadline = time.monotonic() + PATIENCE
    while work_left(conn, everything, doomed, ledgers):
        assert time.monotonic() < deadline, "the runs did not reach their sleeps or ends in time"
        fleet.replace_dead()
        ledgers.operate(conn)
        if killed < 2 and (victim := mid_step(conn, list(fleet.workers))):
            fleet.kill(victim)
            killed += 1
            if killed == 2:
                signal_runs(dsn, everything[1:])
                ledgers.signal(dsn, 1)
        time.sleep(0.05)
    print(
        f"{fleet.deaths} workers died ({killed} killed by the test mid-step), {reruns(conn)} handler runs not completed"
    )
    fired = [point for (point,) in conn.execute("SELECT point FROM kills ORDER BY point")]
    assert fired == sorted(KILL_PLAN), "every kill point was reached"
    assert reruns(conn) >= 2, "the faults hit running steps"
    assert reruns(conn, ledgers.operated()) >= 2, "the faults hit the retried run and the fork"
    end_sleeps(conn, everything)
    check_outcome(conn, everything, doomed, ledgers)


def terminate_workers(conn: psycopg.Connection[Any]) -> tuple[int, datetime]:
    """Terminate every backend of this database's workers and of their handlers: how many, and when."""
    row = conn.execute(
        "SELECT count(*), clock_timestamp() FROM pg_stat_activity, pg_terminate_backend(pid)"
        " WHERE datname = current_database()"  # other tests' workers share the server
        " AND (application_name LIKE 'treadle-worker:%' OR application_name LIKE 'treadle-step:%')"
    ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def test_terminated_backends_lose_no_run_and_rerun_no_completed_step(
    conn: psycopg.Connection[Any], dsn: str, spawn_wf: Spawn
) -> None:
    """Every backend of the workers, their handlers' connections included, terminated again
    and again while workers are mid-step: six sweeps at least, and until one finds a step
    of the retried ledger run or of the fork running."""
    prepare(conn)
    workers = ["w1", "w2"]
    for name in workers:
        spawn_wf(dsn, name)
    until_registered(conn, "w1")
    everything, doomed = start_runs(conn, everything=3, doomed=2)
    ledgers = Ledgers(conn)
    terminated, sweeps, chased = 0, list[datetime](), False
    deadline = time.monotonic() + PATIENCE
    while len(sweeps) < 6 or not chased:
        assert time.monotonic() < deadline, "no sweep found a worker mid-step in a retried or forked run"
        ledgers.operate(conn)
        # a sweep whenever a retried or forked run is mid-step, and any step mid-step for the first six
        chasing = bool(ledgers.operated()) and mid_step(conn, workers, ledgers.operated()) is not None
        if not chasing and (len(sweeps) >= 6 or mid_step(conn, workers) is None):
            time.sleep(0.02)
            continue
        count, at = terminate_workers(conn)
        terminated += count
        sweeps.append(at)
        chased = chased or chasing
        if len(sweeps) == 2:
            signal_runs(dsn, everything)
            ledgers.signal(dsn, 0, 1)
        time.sleep(0.3)
    wait_for(
        lambda: ledgers.operate(conn) and not work_left(conn, everything, doomed, ledgers),
        "every run to reach its sleep or its end",
    )
    print(
        f"{terminated} backends terminated in {len(sweeps)} sweeps, {in_flight(conn, sweeps)} handler runs under way"
        f" then ({in_flight(conn, sweeps, ledgers.operated())} of the retried and forked runs),"
        f" {reruns(conn)} not completed"
    )
    assert terminated >= 6 and in_flight(conn, sweeps) >= 6, "the sweeps hit running steps"
    assert in_flight(conn, sweeps, ledgers.operated()) >= 1, "a sweep hit a running step of the retried or forked runs"
    end_sleeps(conn, everything)
    check_outcome(conn, everything, doomed, ledgers)


def test_a_server_restart_mid_run_loses_no_run_and_reruns_no_completed_step(tmp_path: Path, spawn_wf: Spawn) -> None:
    """PostgreSQL stopped and started while a worker runs a step of the retried ledger run
    or of the fork, and other runs are under way."""
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
            ledgers = Ledgers(conn)
            ledgers.signal(url, 0, 1)
            wait_for(lambda: ledgers.operate(conn), "the ledger runs to fail, then be retried and forked")
            # a handler that started at most 0.1 s ago: the stop comes before its end (0.5 s)
            wait_for(lambda: mid_step(conn, ["w1", "w2"], ledgers.operated(), within=0.1), "a worker mid-step in those")
        pgcluster("stop", cluster)
        pgcluster("start", cluster, port)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
            assert row is not None
            restarted = row[0]
            signal_runs(url, everything)
            wait_for(
                lambda: not work_left(conn, everything, doomed, ledgers), "every run to reach its sleep or its end"
            )
            hit, hit_operated = in_flight(conn, [restarted]), in_flight(conn, [restarted], ledgers.operated())
            print(f"{hit} handler runs under way at the restart ({hit_operated} of the retried and forked runs)")
            assert hit_operated >= 1, "the restart hit a running step of the retried or forked runs"
            end_sleeps(conn, everything)
            check_outcome(conn, everything, doomed, ledgers)
    finally:
        subprocess.run([PGCLUSTER, "stop", cluster], check=False, timeout=120)
