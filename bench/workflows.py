"""Workflows against plain jobs: a linear run, a fan-out of 10,000 with its join, parallel branches.

1. Linear: --linear-runs runs of three steps (a -> b -> c), started in one statement
   (one treadle.start_workflow per run) and drained on one connection by a SQL loop
   (treadle.claim of --batch with the steps' job names, then treadle.complete_many),
   against three times as many plain jobs (one treadle.enqueue each, one statement) drained
   by the same loop. Jobs/s from the start to the last completion, and the ratio of the
   run's time to the plain jobs' time (goal: at most 1.2). The two sides alternate, the
   first switching every run. Beside them, for the server CPU only, plain jobs of three
   names (one of each per run) claimed over the three, as a worker with three handlers
   claims them (and a run's worker its three steps).
2. Fan-out: a map step over --elements elements (bench/workflow_map.py's run: load's
   completion enqueues the element jobs in its transaction), against one
   treadle.enqueue_many of as many rows in the same run: elements/s and the ratio of the
   rates (goal at least 0.6); and the last element's completion, whose transaction enqueues
   the join (from the call to the join's job being available; goal under 1 s).
3. Parallel branches: --parallel-runs runs of a -> b1, b2, b3, b4 -> join, started in one
   statement, drained by 4 connections in threads (the same loop); a sampler reads
   pg_stat_activity every 10 ms: the share of samples where one of the draining backends
   waits on a Lock (goal at most 5%), and the wait events seen. Beside it the same number
   of jobs (six per run) as plain jobs, drained and sampled the same way.

Beside wall-clock rates, the CPU seconds of the server backends that did the work
(/proc/PID/stat; "-" when the server is on another machine), which a shared machine's
load moves far less. Where the time goes: a third side runs each workflow scenario again
with treadle._notify emptied (no NOTIFY treadle_jobs when a step is enqueued), and
--profile reports the linear sides' server self time per function (track_functions = pl).

    .build/venv/bin/python bench/workflows.py [--runs 3] [--linear-runs 2000] [--elements 10000]
                                              [--parallel-runs 1000] [--batch 10]
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    cpu_seconds,
    database,
    fmt,
    median,
    paired_ratio,
    parser,
    print_settings,
    progress,
    server,
    spread,
    table,
)
from psycopg.types.json import Jsonb
from workflow_map import one_run as map_run

TITLE = "Workflows against plain jobs: linear runs, a fan-out and its join, parallel branches"
DRAIN_APP = "bench-wf-drain"  # the draining connections' application_name, for the sampler
CLAIM = "SELECT id, lease_token FROM treadle.claim('bench', ARRAY[%s], names => %s, batch => %s)"
COMPLETE = "SELECT count(*) FROM treadle.complete_many(%s, %s)"
# the worker's cycle: finish the batch and claim the next in one statement (drain "cycle")
CYCLE = ("SELECT finished_id, (job).id, (job).lease_token FROM treadle.complete_and_claim(%s, %s, NULL, 'bench',"
         " ARRAY[%s], %s, %s)")
DRAINS = ("claim", "cycle")  # claim, then complete_many; or complete_and_claim
PARALLEL_AFTER = '{"b1": ["a"], "b2": ["a"], "b3": ["a"], "b4": ["a"], "join": ["b1", "b2", "b3", "b4"]}'
PARALLEL_STEPS = ["a", "b1", "b2", "b3", "b4", "join"]
# Where the time goes: the same run with treadle._notify emptied, for that side only (a
# completion that enqueues the next step sends NOTIFY treadle_jobs; a transaction that
# notified takes one lock, the same for every session, to commit)
QUIET = "run, no NOTIFY"
# Plain jobs as a worker of three handlers runs them: three names, claimed over the three, as
# a run's steps are (the claim over several names reads each name's range, then the best)
PLAIN3 = "plain, three names"
PLAIN3_NAMES = ["plain-a", "plain-b", "plain-c"]
NOTIFY = "treadle._notify(text, text)"
EMPTY_NOTIFY = """
CREATE OR REPLACE FUNCTION treadle._notify(channel text, queue text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
AS $$
BEGIN
    NULL;
END;
$$
"""


@contextmanager
def no_notify(url: str) -> Iterator[None]:
    """treadle._notify sends nothing until the end of the block."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", [NOTIFY]).fetchone()
        assert row is not None
        conn.execute(EMPTY_NOTIFY)
        try:
            yield
        finally:
            conn.execute(row[0])


def backend_cpu(conn: psycopg.Connection[Any]) -> float:
    """CPU seconds the connection's server backend has used (nan when the server is on another machine)."""
    pid = conn.info.backend_pid
    try:  # a process of this machine with the backend's pid, but is it a server process?
        local = b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        local = False
    seconds = cpu_seconds(pid) if local else None
    return float("nan") if seconds is None else seconds


def drain(url: str, queue: str, names: list[str], total: int, batch: int, progress_: list[int],
          lock: threading.Lock, deadlocks: list[int], cpu: list[float], timeout: float = 600,
          how: str = "claim") -> None:
    """Claim `batch` and complete them, on one connection, until `total` jobs are done (by all drainers);
    adds its backend's CPU seconds to cpu[0]. how: "claim" (claim, then complete_many) or "cycle"
    (complete_and_claim)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True, application_name=DRAIN_APP) as conn:
        began = backend_cpu(conn)
        try:
            if how == "cycle":
                cycle_on(conn, queue, names, total, batch, progress_, lock, deadlocks, deadline)
            else:
                drain_on(conn, queue, names, total, batch, progress_, lock, deadlocks, deadline)
        finally:
            with lock:
                cpu[0] += backend_cpu(conn) - began


def drain_on(conn: psycopg.Connection[Any], queue: str, names: list[str], total: int, batch: int,
             progress_: list[int], lock: threading.Lock, deadlocks: list[int], deadline: float) -> None:
    while True:
        rows = conn.execute(CLAIM, (queue, names, batch)).fetchall()
        if rows:
            ids, tokens = [r[0] for r in rows], [r[1] for r in rows]
            while True:
                try:
                    conn.execute(COMPLETE, (ids, tokens))
                    break
                except psycopg.errors.DeadlockDetected:  # rolled back; the jobs are still ours
                    with lock:
                        deadlocks[0] += 1
            with lock:
                progress_[0] += len(rows)
        elif progress_[0] >= total:
            return
        elif time.monotonic() > deadline:
            raise TimeoutError(f"{progress_[0]} of {total} jobs done before the deadline")
        else:
            time.sleep(0.001)


def cycle_on(conn: psycopg.Connection[Any], queue: str, names: list[str], total: int, batch: int,
             progress_: list[int], lock: threading.Lock, deadlocks: list[int], deadline: float) -> None:
    """As drain_on, with the worker's statement: each finishes the jobs held and claims the next."""
    ids: list[int] = []
    tokens: list[Any] = []
    while True:
        try:
            rows = conn.execute(CYCLE, (ids, tokens, queue, names, batch)).fetchall()
        except psycopg.errors.DeadlockDetected:  # rolled back; the jobs are still ours
            with lock:
                deadlocks[0] += 1
            continue
        with lock:
            progress_[0] += len(ids)
        ids = [r[1] for r in rows if r[0] is None]
        tokens = [r[2] for r in rows if r[0] is None]
        if ids:
            continue
        if progress_[0] >= total:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{progress_[0]} of {total} jobs done before the deadline")
        time.sleep(0.001)


def drain_all(url: str, queue: str, names: list[str], total: int, batch: int,
              connections: int, how: str = "claim") -> tuple[int, float]:
    """Drain with `connections` threads, each on its connection: the deadlocks met (retried), and
    the CPU seconds of their server backends."""
    done, deadlocks, cpu, lock = [0], [0], [0.0], threading.Lock()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            drain(url, queue, names, total, batch, done, lock, deadlocks, cpu, how=how)
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)
            done[0] = total  # let the others stop

    threads = [threading.Thread(target=target) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return deadlocks[0], cpu[0]


class Sampler:
    """pg_stat_activity every `interval` s: how many samples saw a draining backend wait on a Lock."""

    def __init__(self, url: str, interval: float = 0.01) -> None:
        self.url, self.interval = url, interval
        self.samples = 0
        self.lock_samples = 0
        self.events: Counter[str] = Counter()  # wait_event_type:wait_event -> backend samples
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                # a lock waited on named by what it locks: object locks on pg_database 0 are
                # NOTIFY's, which every transaction that notified takes to commit, one at a time
                rows = conn.execute(
                    "SELECT a.wait_event_type, a.wait_event || coalesce(' ' || l.classid::regclass || ' '"
                    " || l.objid, '') FROM pg_stat_activity AS a"
                    " LEFT JOIN pg_locks AS l ON l.pid = a.pid AND NOT l.granted AND l.locktype = 'object'"
                    " WHERE a.application_name = %s AND a.state = 'active' AND a.wait_event IS NOT NULL",
                    (DRAIN_APP,),
                ).fetchall()
                self.samples += 1
                self.lock_samples += any(kind == "Lock" for kind, _ in rows)
                self.events.update(f"{kind}:{event}" for kind, event in rows)
                time.sleep(self.interval)

    @property
    def share(self) -> float:
        return 100 * self.lock_samples / self.samples if self.samples else float("nan")


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs CASCADE")
        conn.execute("VACUUM ANALYZE treadle.jobs")
        conn.execute("VACUUM ANALYZE treadle.workflow_runs")


def settle(conn: psycopg.Connection[Any]) -> None:
    """Statistics of the side's own waiting rows, before its drain (not counted in its CPU).

    TRUNCATE keeps a table's column statistics, and ANALYZE of an empty table leaves them as
    they were: without this, a drain planned with whatever an earlier side (or an autovacuum
    that happened to pass mid-drain) left behind, or with none. Without statistics,
    complete_many's UPDATE joined to its input was planned as a sequential scan of the jobs
    for a part of the drain: plain jobs measured 0.17 to 0.27 ms a job by that alone."""
    conn.execute("ANALYZE treadle.jobs")
    conn.execute("ANALYZE treadle.workflow_runs")


def function_times(url: str) -> dict[str, tuple[int, float]]:
    """treadle's functions' calls and self time in ms so far (pg_stat_user_functions; --profile)."""
    time.sleep(0.6)  # backends flush their counts at most once a second, and when they close
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT funcname, calls, self_time FROM pg_stat_user_functions WHERE schemaname = 'treadle'"
        ).fetchall()
    return {name: (calls, self_ms) for name, calls, self_ms in rows}


PROFILE: dict[str, dict[str, float]] = {"run": {}, "plain": {}}  # side -> function -> self ms


def linear_side(url: str, side: str, runs: int, batch: int, queue: str,
                profile: bool = False, how: str = "claim") -> tuple[float, float]:
    """Seconds to start and drain `runs` three-step runs (side 'run') or 3 x runs plain jobs ('plain';
    PLAIN3: a job of each of three names per run, claimed over the three), and the CPU seconds of
    the server backends that did it (the ANALYZE between the two, settle, counted in neither)."""
    reset(url)
    before = function_times(url) if profile else {}
    with no_notify(url) if side == QUIET else nullcontext(), psycopg.connect(url, autocommit=True) as conn:
        began = time.perf_counter()
        cpu = backend_cpu(conn)
        if side == PLAIN3:
            conn.execute(
                "SELECT count(treadle.enqueue(n.n, '{}', queue => %s))"
                " FROM generate_series(1, %s) AS g CROSS JOIN unnest(%s::text[]) AS n(n)",
                (queue, runs, PLAIN3_NAMES),
            )
            names = PLAIN3_NAMES
        elif side != "plain":
            conn.execute(
                "SELECT count(treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b', 'c'], queue => %s))"
                " FROM generate_series(1, %s)",
                (queue, runs),
            )
            names = ["workflow:lin/a", "workflow:lin/b", "workflow:lin/c"]
        else:
            conn.execute(
                "SELECT count(treadle.enqueue('plain', '{}', queue => %s)) FROM generate_series(1, %s)",
                (queue, 3 * runs),
            )
            names = ["plain"]
        cpu = backend_cpu(conn) - cpu
        seconds = time.perf_counter() - began
        settle(conn)
        began = time.perf_counter()
        cpu += drain_all(url, queue, names, 3 * runs, batch, 1, how)[1]
        seconds += time.perf_counter() - began
    if profile and side in PROFILE:
        for name, (_, self_ms) in function_times(url).items():
            PROFILE[side][name] = PROFILE[side].get(name, 0.0) + self_ms - before.get(name, (0, 0.0))[1]
    if side not in ("plain", PLAIN3):
        with psycopg.connect(url, autocommit=True) as conn:
            left = conn.execute("SELECT count(*) FROM treadle.workflow_runs WHERE state <> 'completed'").fetchone()
            assert left is not None and left[0] == 0, f"{left} runs not completed"
    return seconds, cpu


def fan_out_side(url: str, side: str, elements: int, run: int) -> dict[str, float]:
    """The map step's fan-out (workflow_map's run), or one enqueue_many of as many rows."""
    reset(url)
    if side == "map":
        return map_run(url, elements, f"map-{run}")
    jobs = Jsonb([{"name": "element", "args": {"i": i}, "queue": f"many-{run}"} for i in range(elements)])
    with psycopg.connect(url, autocommit=True) as conn:
        began = time.perf_counter()
        conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", (jobs,))
        return {"fan_out": (time.perf_counter() - began) * 1000}


def parallel_side(url: str, side: str, runs: int, batch: int, queue: str, how: str = "claim") -> dict[str, Any]:
    """Start `runs` runs of a -> b1..b4 -> join (or 6 x runs plain jobs), drain with 4 connections, sampled."""
    reset(url)
    total = len(PARALLEL_STEPS) * runs
    with no_notify(url) if side == QUIET else nullcontext(), psycopg.connect(url, autocommit=True) as conn:
        cpu = backend_cpu(conn)
        if side != "plain":
            conn.execute(
                "SELECT count(treadle.start_workflow('par', '{}', steps => %s, after => %s::jsonb, queue => %s))"
                " FROM generate_series(1, %s)",
                (PARALLEL_STEPS, PARALLEL_AFTER, queue, runs),
            )
            names = [f"workflow:par/{s}" for s in PARALLEL_STEPS]
        else:
            conn.execute(
                "SELECT count(treadle.enqueue('plain', '{}', queue => %s)) FROM generate_series(1, %s)",
                (queue, total),
            )
            names = ["plain"]
        cpu = backend_cpu(conn) - cpu
        settle(conn)
        with Sampler(url) as sampler:
            began = time.perf_counter()
            deadlocks, drain_cpu = drain_all(url, queue, names, total, batch, 4, how)
            seconds = time.perf_counter() - began
    if side != "plain":
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE state = 'completed'),"
                " (SELECT count(*) FROM treadle.jobs WHERE step = 'join') FROM treadle.workflow_runs"
            ).fetchone()
            assert row == (runs, runs), f"completed runs and join jobs: {row}, expected {runs} each"
            # the last branch's completion to the join's start, and to its enqueue (ms): median, p99
            join_ms = conn.execute(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s.ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY s.ms),"
                " percentile_cont(0.5) WITHIN GROUP (ORDER BY s.added), percentile_cont(0.99) WITHIN GROUP (ORDER BY s.added)"
                " FROM (SELECT extract(epoch FROM j.started_at - b.last) * 1000 AS ms,"
                " extract(epoch FROM j.created_at - b.last) * 1000 AS added FROM treadle.jobs AS j"
                " JOIN (SELECT workflow_run_id, max(finished_at) AS last FROM treadle.jobs"
                " WHERE queue = %s AND step <> ALL ('{a,join}') GROUP BY 1) AS b USING (workflow_run_id)"
                " WHERE j.queue = %s AND j.step = 'join') AS s",
                (queue, queue),
            ).fetchone()
    return {"jobs_s": total / seconds, "cpu_ms": (cpu + drain_cpu) * 1000 / total, "share": sampler.share,
            "samples": sampler.samples,
            "events": sampler.events, "deadlocks": deadlocks,
            "join_ms": tuple(join_ms) if side != "plain" and join_ms is not None else (0.0, 0.0, 0.0, 0.0)}


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--linear-runs", type=int, default=2000)
    p.add_argument("--elements", type=int, default=10_000)
    p.add_argument("--parallel-runs", type=int, default=1000)
    p.add_argument("--batch", type=int, default=10, help="jobs per claim (default 10)")
    p.add_argument("--profile", action="store_true",
                   help="track_functions = pl: print the linear sides' server time per function (slower)")
    args = p.parse_args()
    linear_runs = 50 if args.smoke else args.linear_runs
    elements = 100 if args.smoke else args.elements
    parallel_runs = 20 if args.smoke else args.parallel_runs
    sides = ["run", "plain", QUIET]
    linear_sides = [*sides, PLAIN3]  # (plain jobs of three names: linear only)
    lin: dict[str, list[tuple[float, float]]] = {side: [] for side in linear_sides}
    fan: dict[str, list[dict[str, float]]] = {"map": [], "many": []}
    par: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with server() as url:
        print_settings(url)
        with database(url, "workflows") as db:
            if args.profile:
                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute(f"ALTER DATABASE {conn.info.dbname} SET track_functions = 'pl'")
            for run in range(args.runs):
                order = sides[run % 3 :] + sides[: run % 3]  # each side first in turn
                for side in linear_sides[run % 4 :] + linear_sides[: run % 4]:
                    progress(f"run {run + 1}/{args.runs}: linear, {side}")
                    lin[side].append(
                        linear_side(db, side, linear_runs, args.batch, f"lin-{run}-{len(lin[side])}", args.profile))
                for side in ("map", "many") if run % 2 == 0 else ("many", "map"):
                    progress(f"run {run + 1}/{args.runs}: fan-out of {elements}, {side}")
                    fan[side].append(fan_out_side(db, side, elements, run))
                for side in order:
                    progress(f"run {run + 1}/{args.runs}: parallel branches, {side}")
                    par[side].append(parallel_side(db, side, parallel_runs, args.batch, f"par-{run}-{len(par[side])}"))

    lin_jobs = 3 * linear_runs
    lin_time = {side: [s for s, _ in values] for side, values in lin.items()}
    lin_rate = {side: [lin_jobs / s for s, _ in values] for side, values in lin.items()}
    lin_cpu = {side: [c * 1000 / lin_jobs for _, c in values] for side, values in lin.items()}
    map_rate = [elements / (s["fan_out"] / 1000) for s in fan["map"]]
    many_rate = [elements / (s["fan_out"] / 1000) for s in fan["many"]]
    joins = [s["join"] for s in fan["map"]]
    par_rate = {side: [s["jobs_s"] for s in values] for side, values in par.items()}
    par_cpu = {side: [s["cpu_ms"] for s in values] for side, values in par.items()}
    par_share = {side: [s["share"] for s in values] for side, values in par.items()}
    table(
        f"{TITLE} (median (range) of {args.runs} runs, batch {args.batch})",
        ["scenario", "workflow", "plain jobs", "workflow / plain", "goal"],
        [
            [f"linear: {linear_runs} runs of 3 steps, 1 connection: jobs/s", spread(lin_rate["run"], 0),
             spread(lin_rate["plain"], 0), "time x" + paired_ratio(lin_time["run"], lin_time["plain"]),
             "time x <= 1.2"],
            ["linear: server CPU ms per job", spread(lin_cpu["run"], 3), spread(lin_cpu["plain"], 3),
             "x" + paired_ratio(lin_cpu["run"], lin_cpu["plain"]), "x <= 1.2"],
            ["linear: the same, plain jobs of three names claimed over the three (a worker of three handlers)",
             spread(lin_cpu["run"], 3), spread(lin_cpu[PLAIN3], 3), "x" + paired_ratio(lin_cpu["run"], lin_cpu[PLAIN3]),
             "-"],
            [f"fan-out: {elements} element jobs enqueued (map step's completion / enqueue_many): jobs/s",
             spread(map_rate, 0), spread(many_rate, 0), "rate x" + paired_ratio(map_rate, many_rate), ">= 0.6"],
            ["fan-in: the last element's completion, the join enqueued (ms)", spread(joins), "-", "-", "< 1000 ms"],
            [f"parallel: {parallel_runs} runs a -> b1..b4 -> join, 4 connections: jobs/s", spread(par_rate["run"], 0),
             spread(par_rate["plain"], 0), "rate x" + paired_ratio(par_rate["run"], par_rate["plain"]), "-"],
            ["parallel: server CPU ms per job", spread(par_cpu["run"], 3), spread(par_cpu["plain"], 3),
             "x" + paired_ratio(par_cpu["run"], par_cpu["plain"]), "-"],
            ["parallel: samples with a backend waiting on a Lock (%)", spread(par_share["run"]),
             spread(par_share["plain"]), "-", "<= 5%"],
            ["where the time goes, treadle._notify emptied:", "", "", "", ""],
            ["linear, no NOTIFY: jobs/s", spread(lin_rate[QUIET], 0), spread(lin_rate["plain"], 0),
             "time x" + paired_ratio(lin_time[QUIET], lin_time["plain"]), "-"],
            ["linear, no NOTIFY: server CPU ms per job", spread(lin_cpu[QUIET], 3), spread(lin_cpu["plain"], 3),
             "x" + paired_ratio(lin_cpu[QUIET], lin_cpu["plain"]), "-"],
            ["parallel, no NOTIFY: jobs/s", spread(par_rate[QUIET], 0), spread(par_rate["plain"], 0),
             "rate x" + paired_ratio(par_rate[QUIET], par_rate["plain"]), "-"],
            ["parallel, no NOTIFY: samples with a Lock wait (%)", spread(par_share[QUIET]),
             spread(par_share["plain"]), "-", "-"],
        ],
        notes=[
            "Sampled every 10 ms: "
            + ", ".join(f"{side} {fmt(median([s['samples'] for s in values]), 0)} samples"
                        for side, values in par.items())
            + "; deadlocks met and retried: "
            + ", ".join(f"{side} {sum(s['deadlocks'] for s in values)}" for side, values in par.items())
            + ".",
            "Wait events of the draining backends, backend samples over all runs: "
            + "; ".join(
                f"{side}: " + (", ".join(f"{event} {count}" for event, count in
                                         sum((s["events"] for s in values), Counter()).most_common(6)) or "none")
                for side, values in par.items()
            )
            + ".",
        ],
    )

    if args.profile:
        per_job = 3 * linear_runs * args.runs
        table(
            "Linear sides: server self time per job by function (track_functions = pl)",
            ["function", "run (us/job)", "plain (us/job)"],
            [[name, fmt(PROFILE["run"].get(name, 0.0) * 1000 / per_job),
              fmt(PROFILE["plain"].get(name, 0.0) * 1000 / per_job)]
             for name in sorted(PROFILE["run"].keys() | PROFILE["plain"].keys(),
                                key=lambda n: -(PROFILE["run"].get(n, 0.0) + PROFILE["plain"].get(n, 0.0)))[:12]],
        )


if __name__ == "__main__":
    main()
