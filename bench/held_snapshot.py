"""Scenario 7, held snapshot: steady load while another session holds a REPEATABLE READ transaction open.

A worker process drains the queue while a producer keeps a backlog of jobs
waiting. After a warm-up, another session opens a REPEATABLE READ transaction,
reads one row and sits idle for --hold seconds, so no dead row can be vacuumed
and every claimed job leaves a dead index entry behind; then it commits
(--holder write: the transaction also takes an id; --holder slot: an unused
logical replication slot instead, created and dropped). A probe
claims one job every 50 ms beside the worker, timing each claim. Reported every
10 s: jobs finished per second, the probe's claim p99, dead tuples, the claim
index size, server time and buffers per claim and per rescue; the wait events
seen during the hold; and the time after the release until throughput is back to 90% of
its level before the hold. The same run with the raw worker on bench_raw.jobs
is the baseline.

    .build/venv/bin/python bench/held_snapshot.py [--warmup 20] [--hold 300] [--after 60] [--holder read|write|slot]
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from harness import (
    RAW_FINISH,
    RAW_INSERT_SELECT,
    TREADLE_CLAIM,
    Stopwatch,
    database,
    fmt,
    median,
    parser,
    percentile,
    print_settings,
    progress,
    ratio,
    raw_claim,
    reset_tables,
    server,
    table,
    worker_processes,
)

TITLE = "Held snapshot: steady load while a REPEATABLE READ transaction stays open"
BACKLOG = 5000  # jobs the producer keeps waiting
CHUNK = 1000  # jobs per producer statement
RECOUNT = 5.0  # seconds between exact counts of the waiting jobs
TABLE = {"treadle": "treadle.jobs", "raw": "bench_raw.jobs"}
CLAIM_INDEX = {"treadle": "treadle.jobs_claim_name_idx", "raw": "bench_raw.jobs_queue_name_priority_run_at_id_idx"}
SLOT = "treadle_bench_held"  # --holder slot: an unused logical replication slot
PROBE = {"worker_id": "probe", "queue": "default", "names": ["bench"], "name": "bench", "batch": 1,
         "lease": "30 seconds"}


@dataclass
class Trace:
    """What one side's run recorded, in seconds since its start."""

    probes: list[tuple[float, float]] = field(default_factory=list)  # (at, claim ms)
    stats: list[tuple[float, int, int, int]] = field(default_factory=list)  # (at, dead, claim index, all indexes)
    # (at, {statement kind: (calls, total ms, shared buffers)}), pg_stat_statements' running totals
    statements: list[tuple[float, dict[str, tuple[int, float, int]]]] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)  # each job's finished_at
    hold: tuple[float, float] = (0.0, 0.0)  # when the snapshot was taken and released
    # (at, wait events of the database's other active sessions, sampled once a second)
    waits: list[tuple[float, list[str]]] = field(default_factory=list)


def producer(url: str, kind: str, stop: threading.Event) -> None:
    """Keep about BACKLOG jobs waiting: enqueued minus finished, counted incrementally, and
    counted exactly every RECOUNT seconds (a job whose finish commits after a later one's
    is missed by the count by finished_at, and such misses would add up until the producer
    stops)."""
    enqueued = finished = 0
    since = "-infinity"
    recounted = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(f"SELECT count(*), max(finished_at)::text FROM {TABLE[kind]} "
                               "WHERE finished_at > %s::timestamptz", [since]).fetchone()
            assert row is not None
            finished += row[0]
            since = row[1] or since
            if time.monotonic() - recounted > RECOUNT:
                waiting = conn.execute(f"SELECT count(*) FROM {TABLE[kind]} "
                                       "WHERE state = ANY ('{available,retryable}')").fetchone()
                assert waiting is not None
                finished = enqueued - waiting[0]
                recounted = time.monotonic()
            while enqueued - finished < BACKLOG and not stop.is_set():
                if kind == "treadle":
                    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)",
                                 [Jsonb([{"name": "bench"}] * CHUNK)])
                else:
                    with conn.transaction():
                        conn.execute(RAW_INSERT_SELECT, {"name": "bench", "args": [Jsonb({})] * CHUNK})
                        conn.execute("SELECT pg_notify('bench_raw_jobs', 'default')")
                enqueued += CHUNK
            stop.wait(0.05)


def probe(url: str, kind: str, stop: threading.Event, start: float, trace: Trace) -> None:
    """Claim one job every 50 ms, timing the claim; finish it at once."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        while not stop.wait(0.05):
            with Stopwatch() as s:
                cur.execute(TREADLE_CLAIM if kind == "treadle" else raw_claim(1), PROBE, prepare=True)
                rows = cur.fetchall()
            trace.probes.append((time.monotonic() - start, s.ms))
            for row in rows:
                if kind == "treadle":
                    cur.execute("SELECT treadle.complete(%s, %s)", [row[0], row[10]], prepare=True)
                else:
                    cur.execute(RAW_FINISH, {"ids": [row[0]]}, prepare=True)


# pg_stat_statements rows per kind of statement, by their text
STATEMENT_KINDS = {"claim": "%treadle.claim(%", "raw claim": "%FROM bench_raw.jobs%FOR UPDATE SKIP LOCKED%",
                   "rescue": "%treadle.rescue()%", "raw rescue": "%RAW RESCUE SCAN%"}
# what a rescue without a cursor reads on the raw side: every running entry whose lease ran out
RAW_RESCUE_SCAN = ("SELECT count(*) /* RAW RESCUE SCAN */ FROM bench_raw.jobs "
                   "WHERE state = 'running' AND lease_until < now()")


HOLDERS = {"read": "a REPEATABLE READ reader", "write": "a writing transaction (it has a transaction id)",
           "slot": "an unused logical replication slot (wal_level=logical)"}


# what the other sessions of the database are waiting for, when they wait
WAITS = ("SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity "
         "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active' "
         "AND wait_event IS NOT NULL")


def statement_totals(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, float, int]]:
    """Running totals of pg_stat_statements per kind, or nothing without the extension."""
    try:
        rows = conn.execute(
            "SELECT k.kind, sum(s.calls)::bigint, sum(s.total_exec_time)::float8, "
            "       sum(s.shared_blks_hit + s.shared_blks_read)::bigint "
            "  FROM pg_stat_statements AS s JOIN unnest(%s::text[], %s::text[]) AS k(kind, pattern) "
            "    ON s.query LIKE k.pattern AND s.query NOT LIKE '%%pg_stat_statements%%' "
            " WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            " GROUP BY k.kind", [list(STATEMENT_KINDS), list(STATEMENT_KINDS.values())]).fetchall()
    except psycopg.Error:
        return {}
    return {kind: (int(calls), float(ms), int(buffers)) for kind, calls, ms, buffers in rows}


def run_side(url: str, kind: str, warmup: float, hold: float, after: float, holder_kind: str = "read") -> Trace:
    trace = Trace()
    stop = threading.Event()
    with psycopg.connect(url, autocommit=True) as conn:
        reset_tables(conn)
        with worker_processes(kind, url, 1, ["--concurrency", "10"]):
            # the database's clock and the monotonic one start together, within a round trip
            origin = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]  # type: ignore[index]
            start = time.monotonic()
            threads = [threading.Thread(target=producer, args=(url, kind, stop), daemon=True),
                       threading.Thread(target=probe, args=(url, kind, stop, start, trace), daemon=True)]
            for t in threads:
                t.start()
            holder = psycopg.connect(url, autocommit=True)  # BEGIN and COMMIT are ours
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            except psycopg.Error:
                pass  # a server without it: those columns stay empty
            try:
                end = warmup + hold + after
                while (now := time.monotonic() - start) < end:
                    if now >= warmup and trace.hold == (0.0, 0.0):
                        if holder_kind == "slot":
                            holder.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [SLOT])
                        else:
                            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                            holder.execute("SELECT count(*) FROM treadle.workflows")
                        if holder_kind == "write":
                            holder.execute("SELECT pg_current_xact_id()")  # a transaction id: a writer
                        trace.hold = (now, 0.0)
                        progress(f"{kind}: snapshot held for {hold:g} s")
                    if trace.hold[0] and not trace.hold[1] and now >= warmup + hold:
                        holder.execute("SELECT pg_drop_replication_slot(%s)" if holder_kind == "slot" else "COMMIT",
                                       [SLOT] if holder_kind == "slot" else None)
                        trace.hold = (trace.hold[0], now)
                        progress(f"{kind}: snapshot released")
                    row = conn.execute(
                        "SELECT n_dead_tup, pg_relation_size(%s::regclass), pg_indexes_size(%s::regclass) "
                        "FROM pg_stat_user_tables WHERE relid = %s::regclass",
                        [CLAIM_INDEX[kind], TABLE[kind], TABLE[kind]]).fetchone()
                    trace.stats.append((now, int(row[0]), int(row[1]), int(row[2])))  # type: ignore[index]
                    trace.waits.append((now, [r[0] for r in conn.execute(WAITS).fetchall()]))
                    if kind == "raw":
                        conn.execute(RAW_RESCUE_SCAN)
                    trace.statements.append((now, statement_totals(conn)))
                    time.sleep(1.0)
            finally:
                holder.close()
                # a slot left behind would keep its WAL and keep the database from being dropped
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE slot_name = %s", [SLOT])
                stop.set()
                for t in threads:
                    t.join(10)
        rows = conn.execute(f"SELECT extract(epoch FROM finished_at)::float8 - %s FROM {TABLE[kind]} "
                            "WHERE finished_at IS NOT NULL AND worker_id <> 'probe'", [origin]).fetchall()
    trace.finished = [r[0] for r in rows]
    return trace


def windows(trace: Trace, side: str, end: float, size: float) -> list[dict[str, Any]]:
    out = []
    t = 0.0
    while t < end - 0.5:
        hi = min(t + size, end)
        probes = [ms for at, ms in trace.probes if t <= at < hi]
        stats = [s for s in trace.stats if t <= s[0] < hi] or trace.stats[-1:]
        held, released = trace.hold
        phase = "before" if hi <= held else ("held" if hi <= released else ("after" if t >= released else "release"))
        claim, rescue = ("claim", "rescue") if side == "treadle" else ("raw claim", "raw rescue")
        out.append({"from": t, "phase": phase, "rate": sum(1 for f in trace.finished if t <= f < hi) / (hi - t),
                    "p99": percentile(probes, 99), "dead": stats[-1][1], "index": stats[-1][2],
                    "indexes": stats[-1][3], "claim": per_call(trace, claim, t, hi),
                    "rescue": per_call(trace, rescue, t, hi)})
        t = hi
    return out


def per_call(trace: Trace, kind: str, lo: float, hi: float) -> tuple[float, float]:
    """(ms, shared buffers) per call of a kind of statement between two samples."""
    inside = [totals.get(kind) for at, totals in trace.statements if lo <= at < hi]
    before = [totals.get(kind) for at, totals in trace.statements if at < lo]
    first = before[-1] if before and before[-1] else (0, 0.0, 0)
    last = inside[-1] if inside and inside[-1] else None
    if last is None or last[0] == first[0]:
        return float("nan"), float("nan")
    calls = last[0] - first[0]
    return (last[1] - first[1]) / calls, (last[2] - first[2]) / calls


def recovery_seconds(trace: Trace) -> float:
    """Seconds from the release to the end of the first 1 s bucket (in 0.5 s steps) whose
    rate is back to 90% of the median 1 s rate before the hold."""
    held, released = trace.hold
    before = [sum(1 for f in trace.finished if s <= f < s + 1) for s in range(2, int(held))]
    level = 0.9 * median(before) if before else 0
    t = released
    while t < max(trace.finished, default=0):
        if sum(1 for f in trace.finished if t <= f < t + 1) >= level:
            return t + 1 - released
        t += 0.5
    return float("nan")


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--warmup", type=float, default=20, help="seconds of load before the hold (default 20)")
    p.add_argument("--hold", type=float, default=300, help="seconds the snapshot is held (default 300)")
    p.add_argument("--after", type=float, default=60, help="seconds of load after the release (default 60)")
    p.add_argument("--window", type=float, default=10, help="seconds per reported row (default 10)")
    p.add_argument("--holder", choices=["read", "write", "slot"], default="read",
                   help="what holds the snapshot: a REPEATABLE READ reader (default), a writer (a transaction "
                        "that has an id), or an unused logical replication slot (the cluster runs with "
                        "wal_level=logical)")
    args = p.parse_args()
    warmup, hold, after, size = args.warmup, args.hold, args.after, args.window
    if args.smoke:
        warmup, hold, after, size = 3.0, 2.0, 2.0, 1.0

    traces: dict[str, Trace] = {}
    statements = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    if args.holder == "slot":
        statements["wal_level"] = "logical"
    with server(statements) as url, database(url, "held") as db:
        print_settings(db)
        for kind in ("treadle", "raw"):
            progress(f"{kind}: {warmup:g} s warm-up, {hold:g} s held, {after:g} s after")
            traces[kind] = run_side(db, kind, warmup, hold, after, args.holder)

    end = warmup + hold + after
    per_side = {kind: windows(trace, kind, end, size) for kind, trace in traces.items()}
    rows = []
    for t, r in zip(per_side["treadle"], per_side["raw"], strict=True):
        rows.append([f"{t['from']:.0f}-{t['from'] + size:.0f} s", t["phase"], fmt(t["rate"], 0), fmt(r["rate"], 0),
                     ratio(t["rate"], r["rate"]), fmt(t["p99"]), fmt(r["p99"]),
                     f"{fmt(t['claim'][0], 2)} / {fmt(t['claim'][1], 0)}",
                     f"{fmt(r['claim'][0], 2)} / {fmt(r['claim'][1], 0)}",
                     f"{fmt(t['rescue'][0], 2)} / {fmt(t['rescue'][1], 0)}",
                     f"{fmt(r['rescue'][0], 2)} / {fmt(r['rescue'][1], 0)}", f"{t['dead']:,}", f"{r['dead']:,}",
                     f"{t['index'] / 2**20:.1f} / {t['indexes'] / 2**20:.1f}",
                     f"{r['index'] / 2**20:.1f} / {r['indexes'] / 2**20:.1f}"])

    def level(kind: str, phase: str, last: bool = False) -> float:
        rates = [w["rate"] for w in per_side[kind] if w["phase"] == phase]
        return (rates[-1] if last else median(rates)) if rates else float("nan")

    notes = [f"The hold from {traces['treadle'].hold[0]:.0f} s to {traces['treadle'].hold[1]:.0f} s; "
             f"one worker process (concurrency 10), a backlog of about {BACKLOG:,} jobs, a probe claim every 50 ms. "
             f"Held: {HOLDERS[args.holder]}. "
             "Columns, treadle then raw: jobs/s; probe claim p99, ms; per claim and per rescue, server ms / shared "
             "buffers (pg_stat_statements; raw rescue: the scan of a rescue without a cursor, once a second); "
             "dead tuples; claim index / all indexes, MiB."]
    for kind in ("treadle", "raw"):
        before, held_end = level(kind, "before"), level(kind, "held", last=True)
        change = f"{100 * (held_end / before - 1):+.0f}%" if before else "-"
        notes.append(f"{kind}: {fmt(before, 0)} jobs/s before, {fmt(held_end, 0)} in the last window of the hold "
                     f"({change}); back to 90% of the rate before within {fmt(recovery_seconds(traces[kind]), 1)} s "
                     "of the release.")
    for kind in ("treadle", "raw"):
        held, released = traces[kind].hold
        seen = Counter(w for at, waits in traces[kind].waits if held <= at < released for w in waits)
        samples = sum(1 for at, _ in traces[kind].waits if held <= at < released)
        notes.append(f"{kind}: waits seen in {samples} samples of the sessions during the hold: "
                     + (", ".join(f"{w} {n}" for w, n in seen.most_common(6)) or "none"))
    table(TITLE, ["window", "phase", "treadle jobs/s", "raw jobs/s", "ratio", "treadle p99", "raw p99",
                  "treadle claim", "raw claim", "treadle rescue", "raw rescue", "treadle dead", "raw dead",
                  "treadle idx MiB", "raw idx MiB"], rows, notes)


if __name__ == "__main__":
    main()
