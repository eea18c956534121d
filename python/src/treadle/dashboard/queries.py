"""Every SQL statement the dashboard sends, and the reads built on them.

Reads go only to the extension's views and public read functions, all of a page's
reads in one read-only REPEATABLE READ transaction (one consistent snapshot, and a
guarantee that showing a page changes nothing). Changes go only through
treadle.cancel, treadle.retry and treadle.cancel_workflow. So a role set up with
treadle.grant_dashboard (read_only => true for a dashboard that only reads) is all
the dashboard needs.

JSON values are decoded here, never with a risk of failing: a value nested deeper
than 0.2.0 accepts (rows written by 0.1.0 may hold one) reaches the pages as its
text (RawJson) instead of stopping the page with a RecursionError.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from ..models import JOB_STATES

if TYPE_CHECKING:
    from typing_extensions import LiteralString

Row = dict[str, Any]

READ_ONLY: Final = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
# a short timeout bounds a page's cost; JIT only slows queries this small down
SESSION_LIMITS: Final = "SELECT set_config('statement_timeout', %(timeout)s, true), set_config('jit', 'off', true)"
NOW: Final = "SELECT treadle.now() AS now"  # treadle's clock, which a test may move
VERSION: Final = "SELECT treadle.version() AS version"

COUNTS: Final = """
SELECT queue, state, jobs, estimated, oldest_available_age
  FROM treadle.job_counts(exact_up_to => %(exact_up_to)s)
"""
THROUGHPUT: Final = "SELECT minute, completed, discarded FROM treadle.throughput"
RECENT_FAILURES: Final = """
SELECT id, queue, name, state, attempt, max_attempts, last_error, failed_at, workflow_run_id, step
  FROM treadle.recent_failures
 LIMIT %(limit)s
"""
RUN_COLUMNS: Final = "id, name, state, current_step, steps_done, steps_total, created_at, finished_at"
RECENT_RUNS: Final = f"SELECT {RUN_COLUMNS} FROM treadle.workflow_run_overview LIMIT %(limit)s"
RUN: Final = f"SELECT {RUN_COLUMNS}, steps, input FROM treadle.workflow_run_overview WHERE id = %(run_id)s"
RUN_STEPS: Final = """
SELECT position, step, job_id, state, attempt, max_attempts, cancel_requested, has_result, result,
       last_error, progress, progress_message, run_at, started_at, finished_at
  FROM treadle.workflow_run_steps
 WHERE run_id = %(run_id)s
 ORDER BY position
"""
LIVE_WORKERS: Final = """
SELECT id, host, pid, queues, concurrency, running_jobs, started_at, last_seen
  FROM treadle.live_workers
"""
# every column a reader may see (never the lease token: a worker's write credential)
JOB: Final = """
SELECT id, queue, name, args, state, priority, run_at, attempt, max_attempts, lease_until, worker_id,
       idempotency_key, result, last_error, created_at, finished_at, workflow_run_id, step, every, next_id,
       cancel_requested, started_at, failed_at, errors, progress, progress_message
  FROM treadle.job_details
 WHERE id = %(job_id)s
"""
JOB_STATE: Final = "SELECT state, cancel_requested FROM treadle.job_details WHERE id = %(job_id)s"
RUN_STATE: Final = "SELECT state FROM treadle.workflow_run_overview WHERE id = %(run_id)s"
# Keyset pagination: newest first, the next page starts below the last id shown.
# A filter left null drops out when the statement is planned for its values.
SEARCH: Final = """
SELECT id, queue, name, state, attempt, max_attempts, priority, run_at, created_at, finished_at,
       workflow_run_id, step, last_error, cancel_requested
  FROM treadle.job_details
 WHERE (%(name)s::text IS NULL OR starts_with(name, %(name)s::text))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s
"""

CANCEL: Final = "SELECT treadle.cancel(%(job_id)s) AS changed"
RETRY: Final = "SELECT treadle.retry(%(job_id)s) AS changed"
CANCEL_RUN: Final = "SELECT treadle.cancel_workflow(%(run_id)s) AS changed"


# the deepest JSON nesting extension 0.2.0 accepts; anything deeper is shown as text
MAX_JSON_DEPTH: Final = 100


@dataclass(frozen=True)
class RawJson:
    """A JSON value too deeply nested to decode safely, kept as the text the database sent."""

    text: str


def decode_json(data: str | bytes) -> Any:
    """json.loads, or RawJson when the value nests deeper than MAX_JSON_DEPTH."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        value = json.loads(text)
    except RecursionError:
        return RawJson(text)
    return RawJson(text) if _nests_deeper(value, MAX_JSON_DEPTH) else value


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (walked without recursion)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


@dataclass(frozen=True)
class StateCount:
    state: str
    jobs: int
    estimated: bool


@dataclass
class QueueCounts:
    queue: str
    counts: dict[str, StateCount] = field(default_factory=dict)
    oldest_available_age: timedelta | None = None


@dataclass(frozen=True)
class Overview:
    now: datetime
    totals: list[StateCount]
    queues: list[QueueCounts]
    throughput: list[Row]
    failures: list[Row]
    runs: list[Row]
    workers: list[Row]
    open_run: RunDetail | None

    @property
    def estimated(self) -> bool:
        return any(c.estimated for c in self.totals) or any(c.estimated for q in self.queues for c in q.counts.values())


@dataclass(frozen=True)
class RunDetail:
    run: Row
    steps: list[Row]


@dataclass(frozen=True)
class SearchFilter:
    """A job search; None means "any". The page holds jobs with ids below `before`."""

    name: str | None = None
    queue: str | None = None
    state: str | None = None
    before: int | None = None


@dataclass(frozen=True)
class SearchPage:
    now: datetime
    jobs: list[Row]
    next_before: int | None  # the cursor of the next (older) page, None on the last


@dataclass(frozen=True)
class Outcome:
    """What an action did: `changed` when the function applied it; else the row as it is now."""

    changed: bool
    state: str | None  # None: no such job or run
    cancel_requested: bool = False


class Store:
    """The dashboard's only way to the database."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        owns_pool: bool,
        statement_timeout_ms: int,
        exact_counts_up_to: int,
    ) -> None:
        self.pool = pool
        self.owns_pool = owns_pool
        self.statement_timeout_ms = statement_timeout_ms
        self.exact_counts_up_to = exact_counts_up_to

    def close(self) -> None:
        if self.owns_pool:
            self.pool.close()

    @contextmanager
    def _cursor(self, *, read_only: bool) -> Iterator[psycopg.Cursor[Row]]:
        with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            set_json_loads(decode_json, cur)
            if read_only:
                cur.execute(READ_ONLY)
            cur.execute(SESSION_LIMITS, {"timeout": f"{self.statement_timeout_ms}ms"})
            yield cur

    @contextmanager
    def reading(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection in a read-only transaction under the dashboard's limits (for /metrics)."""
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(READ_ONLY)
            conn.execute(SESSION_LIMITS, {"timeout": f"{self.statement_timeout_ms}ms"})
            yield conn

    def version(self) -> str:
        with self._cursor(read_only=True) as cur:
            row = cur.execute(VERSION).fetchone()
            return str(row["version"]) if row else ""

    def overview(self, *, failures: int, runs: int, open_run: int | None) -> Overview | None:
        """The front page; None when `open_run` names no run."""
        with self._cursor(read_only=True) as cur:
            now = _now(cur)
            detail = _run_detail(cur, open_run) if open_run is not None else None
            if open_run is not None and detail is None:
                return None
            totals, queues = _counts(cur.execute(COUNTS, {"exact_up_to": self.exact_counts_up_to}).fetchall())
            return Overview(
                now=now,
                totals=totals,
                queues=queues,
                throughput=cur.execute(THROUGHPUT).fetchall(),
                failures=cur.execute(RECENT_FAILURES, {"limit": failures}).fetchall(),
                runs=cur.execute(RECENT_RUNS, {"limit": runs}).fetchall(),
                workers=cur.execute(LIVE_WORKERS).fetchall(),
                open_run=detail,
            )

    def job(self, job_id: int) -> tuple[datetime, Row | None]:
        with self._cursor(read_only=True) as cur:
            return _now(cur), cur.execute(JOB, {"job_id": job_id}).fetchone()

    def run(self, run_id: int) -> tuple[datetime, RunDetail | None]:
        with self._cursor(read_only=True) as cur:
            return _now(cur), _run_detail(cur, run_id)

    def search(self, where: SearchFilter, *, page_size: int) -> SearchPage:
        params = {
            "name": where.name,
            "queue": where.queue,
            "state": where.state,
            "before": where.before,
            "limit": page_size + 1,  # one more tells whether an older page exists
        }
        with self._cursor(read_only=True) as cur:
            now = _now(cur)
            # never prepared: each search is planned for its own filters
            rows = cur.execute(SEARCH, params, prepare=False).fetchall()
        more = len(rows) > page_size
        rows = rows[:page_size]
        return SearchPage(now=now, jobs=rows, next_before=rows[-1]["id"] if more and rows else None)

    def retry_job(self, job_id: int) -> Outcome:
        return self._act_on_job(RETRY, job_id)

    def cancel_job(self, job_id: int) -> Outcome:
        return self._act_on_job(CANCEL, job_id)

    def cancel_run(self, run_id: int) -> Outcome:
        with self._cursor(read_only=False) as cur:
            changed = _changed(cur.execute(CANCEL_RUN, {"run_id": run_id}).fetchone())
            row = cur.execute(RUN_STATE, {"run_id": run_id}).fetchone()
        return Outcome(changed=changed, state=row["state"] if row else None)

    def _act_on_job(self, statement: LiteralString, job_id: int) -> Outcome:
        with self._cursor(read_only=False) as cur:
            changed = _changed(cur.execute(statement, {"job_id": job_id}).fetchone())
            row = cur.execute(JOB_STATE, {"job_id": job_id}).fetchone()
        if row is None:
            return Outcome(changed=changed, state=None)
        return Outcome(changed=changed, state=row["state"], cancel_requested=row["cancel_requested"])


def _now(cur: psycopg.Cursor[Row]) -> datetime:
    row = cur.execute(NOW).fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


def _changed(row: Row | None) -> bool:
    return bool(row and row["changed"])


def _run_detail(cur: psycopg.Cursor[Row], run_id: int) -> RunDetail | None:
    run = cur.execute(RUN, {"run_id": run_id}).fetchone()
    if run is None:
        return None
    return RunDetail(run=run, steps=cur.execute(RUN_STEPS, {"run_id": run_id}).fetchall())


def _counts(rows: list[Row]) -> tuple[list[StateCount], list[QueueCounts]]:
    """Split job_counts rows into the per-state totals and one entry per queue."""
    totals = {state: StateCount(state, 0, False) for state in JOB_STATES}
    queues: dict[str, QueueCounts] = {}
    for row in rows:
        count = StateCount(row["state"], int(row["jobs"]), bool(row["estimated"]))
        if row["queue"] is None:
            totals[count.state] = count
            continue
        entry = queues.setdefault(row["queue"], QueueCounts(row["queue"]))
        entry.counts[count.state] = count
        entry.oldest_available_age = row["oldest_available_age"]
    return [totals[s] for s in JOB_STATES], list(queues.values())
