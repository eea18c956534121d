"""The dashboard's reads, and the statements only the dashboard sends (those it shares
with the CLI or the client come from _sql.py).

Reads go only to the extension's views and public read functions, all of a page's
reads in one read-only REPEATABLE READ transaction (one consistent snapshot, and a
guarantee that showing a page changes nothing). Changes go only through the client's
functions: cancel, retry (in bulk, retry_many and cancel_many), the run operations
(cancel_workflow, retry_run, compensate_run, fork_run) and the queue controls
(pause, resume, set_queue). So a role set up with treadle.grant_dashboard
(read_only => true for a dashboard that only reads) is all the dashboard needs.

JSON values are decoded here, never with a risk of failing: a value nested deeper
than 0.2.0 accepts (rows written by 0.1.0 may hold one) reaches the pages as its
text (RawJson) instead of stopping the page with a RecursionError.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb, set_json_loads
from psycopg_pool import ConnectionPool

from .. import _sql, client
from .._compat import EXTENSION_VERSION, version_problem
from .._dsn import Redactor
from .._sql import QUEUE_RANKS
from ..errors import TreadleError
from ..models import JOB_STATES

Row = dict[str, Any]
T = TypeVar("T")

READ_ONLY: Final = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
# a short timeout bounds a page's cost; JIT only slows queries this small down
SESSION_LIMITS: Final = "SELECT set_config('statement_timeout', %(timeout)s, true), set_config('jit', 'off', true)"
NOW: Final = "SELECT treadle.now() AS now"  # treadle's clock, which a test may move

# The overview's page of queues: the totals (queue null), the counts of the queues ranked
# %(offset)s + 1 to %(offset)s + %(limit)s (_sql.QUEUE_RANKS: the most jobs waiting or
# running first), whether each is paused, how many queues have jobs, and up to %(limit)s
# paused queues that have none (state null). However many queues there are, a page holds
# at most %(limit)s of them.
OVERVIEW_COUNTS: Final = (
    """
WITH counts AS MATERIALIZED (
    SELECT queue, state, jobs, estimated, oldest_available_age
      FROM treadle.job_counts(exact_up_to => %(exact_up_to)s)),"""
    + QUEUE_RANKS
    + """
SELECT *
  FROM (SELECT c.queue, c.state, c.jobs, c.estimated, c.oldest_available_age, r.rank,
               coalesce(s.paused, false) AS paused, (SELECT count(*) FROM ranked) AS queue_count
          FROM counts AS c
          LEFT JOIN ranked AS r ON r.queue = c.queue
          LEFT JOIN treadle.queue_settings AS s ON s.queue = c.queue
         WHERE c.queue IS NULL OR (r.rank > %(offset)s AND r.rank <= %(offset)s + %(limit)s)
        UNION ALL
        (SELECT s.queue, NULL, NULL, NULL, NULL, NULL, true, NULL
           FROM treadle.queue_settings AS s
          WHERE s.paused AND NOT EXISTS (SELECT FROM ranked AS r WHERE r.queue = s.queue)
          ORDER BY s.queue
          LIMIT %(limit)s)) AS page
 ORDER BY rank NULLS FIRST, queue
"""
)
THROUGHPUT: Final = "SELECT minute, completed, discarded FROM treadle.throughput"
RECENT_FAILURES: Final = """
SELECT id, queue, name, state, attempt, max_attempts, last_error, failed_at, workflow_run_id, step
  FROM treadle.recent_failures
 LIMIT %(limit)s
"""
RUN_COLUMNS: Final = "id, name, state, current_step, steps_done, steps_total, created_at, finished_at"
RECENT_RUNS: Final = f"SELECT {RUN_COLUMNS} FROM treadle.workflow_run_overview LIMIT %(limit)s"
RUN: Final = f"""
SELECT {RUN_COLUMNS}, steps, input, parent_run_id, parent_step,
       ARRAY(SELECT c.id FROM treadle.workflow_runs AS c WHERE c.parent_run_id = o.id ORDER BY c.id) AS children,
       r.forked_from, r.forked_step, r.compensations IS NOT NULL AS compensable,
       -- the steps that are no handler's job, by kind, as the run's definition names them
       jsonb_strip_nulls(jsonb_build_object('sleep', r.sleeps, 'signal', r.waits, 'map', r.maps,
                                            'child', r.children)) AS kinds,
       ARRAY(SELECT f.id FROM treadle.workflow_runs AS f WHERE f.forked_from = o.id ORDER BY f.id LIMIT 100) AS forks
  FROM treadle.workflow_run_overview AS o
 CROSS JOIN LATERAL (SELECT r.forked_from, r.forked_step, r.compensations, r.sleeps, r.waits, r.maps, r.children
                       FROM treadle.workflow_runs AS r WHERE r.id = o.id) AS r  -- (the run's row, read once)
 WHERE o.id = %(run_id)s
"""
RUN_STEPS: Final = """
SELECT position, step, job_id, state, attempt, max_attempts, cancel_requested, has_result, result,
       last_error, progress, progress_message, run_at, started_at, finished_at, after, sleeps_until, waits_for,
       child_run_id
  FROM treadle.workflow_run_steps
 WHERE run_id = %(run_id)s
 ORDER BY position
"""
# every column a reader may see (never the lease token: a worker's write credential)
JOB: Final = """
SELECT id, queue, name, args, state, priority, run_at, attempt, max_attempts, lease_until, worker_id,
       idempotency_key, result, last_error, created_at, finished_at, workflow_run_id, step, every, next_id,
       cancel_requested, started_at, failed_at, errors, progress, progress_message, meta
  FROM treadle.job_details
 WHERE id = %(job_id)s
"""
JOB_STATE: Final = "SELECT state, cancel_requested FROM treadle.job_details WHERE id = %(job_id)s"
RUN_STATE: Final = "SELECT state FROM treadle.workflow_run_overview WHERE id = %(run_id)s"
# Keyset pagination: newest first, the next page starts below the last id shown.
# A filter left null drops out when the statement is planned for its values.
# Three searches are bounded by an index: an idempotency key with its queue (the
# unique index), jobs still failed whose last failure falls in a time range (the
# failed_at index that recent_failures reads: its predicate is repeated word for
# word, so the planner can use it), and the newest jobs with no filter (the primary
# key). Any other filter (name, queue, state, args, meta, worker, error text) has no index
# over finished jobs, so such a search reads only a window of jobs, between floor
# and before (see Store.search), rather than the whole table when matches are rare.
SEARCH_COLUMNS: Final = """id, queue, name, state, attempt, max_attempts, priority, run_at, created_at, finished_at,
       workflow_run_id, step, last_error, cancel_requested, worker_id, idempotency_key"""
FILTERS: Final = """(%(name)s::text IS NULL OR starts_with(name, %(name)s::text))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
   AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
   AND (%(meta)s::jsonb IS NULL OR meta @> %(meta)s::jsonb)
   AND (%(worker)s::text IS NULL OR starts_with(worker_id, %(worker)s::text))
   AND (%(error)s::text IS NULL
        OR strpos(lower(last_error), lower(%(error)s::text)) > 0
        OR EXISTS (SELECT 1
                     FROM jsonb_array_elements(CASE jsonb_typeof(errors) WHEN 'array' THEN errors END) AS e
                    WHERE strpos(lower(e.value ->> 'error'), lower(%(error)s::text)) > 0))
   AND (%(failed_after)s::timestamptz IS NULL AND %(failed_before)s::timestamptz IS NULL
        OR (state = ANY (ARRAY['retryable', 'discarded']) AND last_error IS NOT NULL
            AND failed_at >= coalesce(%(failed_after)s::timestamptz, '-infinity')
            AND failed_at < coalesce(%(failed_before)s::timestamptz, 'infinity')))
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
   AND (%(floor)s::bigint IS NULL OR id >= %(floor)s::bigint)"""
SEARCH: Final = f"""
SELECT {SEARCH_COLUMNS}
  FROM treadle.job_details
 WHERE {FILTERS}
 ORDER BY id DESC
 LIMIT %(limit)s
"""
# The lowest id of the `window` newest jobs below `before` (null: fewer remain),
# read from the primary key alone.
WINDOW_FLOOR: Final = """
SELECT id FROM treadle.job_details
 WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
 ORDER BY id DESC
 OFFSET %(window)s - 1
 LIMIT 1
"""
NEWEST_ID: Final = """
SELECT max(id) AS id FROM treadle.job_details WHERE %(before)s::bigint IS NULL OR id < %(before)s::bigint
"""
# What a bulk action would change: the matches in a window, in the states the action applies to.
BULK_MATCHES: Final = f"""
SELECT id FROM treadle.job_details
 WHERE {FILTERS}
   AND id <= %(upto)s::bigint
   AND state = ANY (%(states)s::text[])
   AND NOT (state = 'running' AND cancel_requested)
 ORDER BY id DESC
 LIMIT %(limit)s
"""

# The queue page. Finished jobs per minute come from the finished_at index, like the
# throughput view (which counts every queue); failures from the failed_at index.
# One range scan of the finished_at index, counted per minute, then laid on the hour's
# minutes (joining each minute to the index instead took 10 times as long on 10M jobs).
QUEUE_THROUGHPUT: Final = """
SELECT m.minute, coalesce(c.completed, 0) AS completed, coalesce(c.discarded, 0) AS discarded
  FROM generate_series(date_trunc('minute', treadle.now()) - interval '59 minutes',
                       date_trunc('minute', treadle.now()),
                       interval '1 minute') AS m(minute)
  LEFT JOIN (SELECT date_trunc('minute', j.finished_at) AS minute,
                    count(*) FILTER (WHERE j.state = 'completed') AS completed,
                    count(*) FILTER (WHERE j.state = 'discarded') AS discarded
               FROM treadle.job_details AS j
              WHERE j.finished_at >= date_trunc('minute', treadle.now()) - interval '59 minutes'
                AND j.finished_at < date_trunc('minute', treadle.now()) + interval '1 minute'
                AND j.state = ANY (ARRAY['completed', 'discarded'])
                AND j.queue = %(queue)s
              GROUP BY 1) AS c ON c.minute = m.minute
 ORDER BY m.minute
"""
# One queue's counts, as job_counts gives them but reading only that queue's rows:
# exactly on small tables (treadle.jobs and its history together); on a large one, waiting states from the claim index
# (queue first) when their estimate is small enough, running from the lease index,
# finished states estimated (no index covers them).
TABLE_IS_SMALL: Final = """
SELECT c.reltuples < 0 OR c.reltuples + h.reltuples <= %(exact_up_to)s AS small
  FROM pg_catalog.pg_class AS c,
       (SELECT coalesce(sum(greatest(p.reltuples, 0)), 0) AS reltuples
          FROM pg_catalog.pg_inherits AS i JOIN pg_catalog.pg_class AS p ON p.oid = i.inhrelid
         WHERE i.inhparent = 'treadle.job_history'::regclass) AS h
 WHERE c.oid = 'treadle.jobs'::regclass
"""
QUEUE_EXACT_COUNTS: Final = """
SELECT state, count(*) AS jobs FROM treadle.job_details WHERE queue = %(queue)s GROUP BY state
"""
QUEUE_ESTIMATES: Final = """
SELECT s.state, treadle.estimated_jobs(%(queue)s, s.state) AS jobs FROM unnest(%(states)s::text[]) AS s(state)
"""
QUEUE_WAITING_COUNTS: Final = """
SELECT state, count(*) AS jobs
  FROM treadle.job_details
 WHERE queue = %(queue)s
   AND state = ANY (ARRAY['available', 'retryable'])
   AND state = ANY (%(states)s::text[])
 GROUP BY state
"""
QUEUE_RUNNING_COUNT: Final = """
SELECT count(*) AS jobs FROM treadle.job_details
 WHERE queue = %(queue)s AND lease_until IS NOT NULL AND state = 'running'
"""
QUEUE_OLDEST_WAITING: Final = """
SELECT treadle.now() - min(run_at) AS age
  FROM treadle.job_details
 WHERE queue = %(queue)s AND state = ANY (ARRAY['available', 'retryable']) AND run_at <= treadle.now()
"""
# A queue's failures among the newest FAILURES_WINDOW of all queues: the failed_at
# index is not by queue, so a queue with no failure would otherwise walk all of it.
FAILURES_WINDOW: Final = 10_000
QUEUE_FAILURES: Final = f"""
SELECT id, queue, name, state, attempt, max_attempts, last_error, failed_at, workflow_run_id, step
  FROM (SELECT * FROM treadle.recent_failures LIMIT {FAILURES_WINDOW}) AS f
 WHERE queue = %(queue)s
 LIMIT %(limit)s
"""

# set_queue's settings, in its order: what the queue page's form holds
QUEUE_LIMITS: Final = ("concurrency", "rate_limit", "rate_period", "max_depth", "retain_completed", "retain_failed")


# the deepest JSON nesting extension 0.2.0 accepts; anything deeper is shown as text
MAX_JSON_DEPTH: Final = 100
WAITING: Final = ("available", "retryable")


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
    paused: frozenset[str] = frozenset()  # the queues that are paused, among those shown
    queue_count: int = 0  # how many queues have jobs (the page shows some of them)
    queue_offset: int = 0  # the queues ranked before this page's
    queue_limit: int = 50  # the most queues a page shows
    paused_empty: list[str] = field(default_factory=list)  # paused queues without jobs (at most queue_limit)

    @property
    def estimated(self) -> bool:
        return any(c.estimated for c in self.totals) or any(c.estimated for q in self.queues for c in q.counts.values())


@dataclass(frozen=True)
class QueuePage:
    now: datetime
    counts: QueueCounts
    exists: bool  # the queue holds jobs now
    throughput: list[Row]
    failures: list[Row]
    workers: list[Row]
    settings: Row | None  # treadle.queue_settings' row; None: no setting, not paused


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
    key: str | None = None  # an idempotency key, exactly
    args: Any = None  # a decoded JSON object or array the job's args must contain
    worker: str | None = None  # the start of the id of the worker that last ran it
    error: str | None = None  # text in its last error or its error history, any case
    failed_after: datetime | None = None  # still failed, its last failure at or after this
    failed_before: datetime | None = None  # ... and before this
    before: int | None = None
    meta: Any = None  # a decoded JSON object the job's meta must contain

    @property
    def failed_range(self) -> bool:
        return self.failed_after is not None or self.failed_before is not None

    @property
    def indexed(self) -> bool:
        """Whether an index bounds what the search reads, whatever else it filters by."""
        return self.failed_range or (self.key is not None and self.queue is not None)

    @property
    def windowed(self) -> bool:
        """Whether the search reads a window of jobs: it filters, and no index bounds it."""
        filters = (self.name, self.queue, self.state, self.key, self.args, self.worker, self.error, self.meta)
        return any(v is not None for v in filters) and not self.indexed

    def params(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queue": self.queue,
            "state": self.state,
            "key": self.key,
            "args": Jsonb(self.args) if self.args is not None else None,
            "worker": self.worker,
            "error": self.error,
            "failed_after": self.failed_after,
            "failed_before": self.failed_before,
            "before": self.before,
            "meta": Jsonb(self.meta) if self.meta is not None else None,
        }


@dataclass(frozen=True)
class SearchPage:
    now: datetime
    jobs: list[Row]
    next_before: int | None  # the cursor of the next (older) page, None on the last
    window: int | None  # how many jobs a windowed search reads per page; None: all
    floor: int | None  # a windowed search read ids from here up to `before`; None: to the oldest

    @property
    def window_exhausted(self) -> bool:
        """A windowed page that shows every match of its window: older pages read older windows."""
        return self.window is not None and (not self.jobs or self.next_before == self.floor)


@dataclass(frozen=True)
class BulkPlan:
    """What a bulk action would touch: matches in the window [floor, upto], at most `limit`."""

    now: datetime
    matches: int  # how many it would act on (at most limit)
    more: bool  # more match than the limit
    upto: int | None  # the newest job id it looked at (None: no job at all)
    floor: int | None  # the oldest id it looked at (None: down to the oldest job)


@dataclass(frozen=True)
class BulkOutcome:
    """What a bulk action did, batch by batch, until done or refused."""

    attempted: int  # jobs in the batches that committed
    changed: int  # of those, the ones the function changed
    batches: int
    total: int  # jobs it set out to act on
    refused: psycopg.Error | None = None  # the database's refusal that stopped it


@dataclass(frozen=True)
class Outcome:
    """What an action did: `changed` when the function applied it; else the row as it is now."""

    changed: bool
    state: str | None  # None: no such job or run
    cancel_requested: bool = False


@dataclass(frozen=True)
class RunOutcome:
    """What retry_run or fork_run did: the run's state now, the new run, or the database's refusal."""

    state: str | None = None
    new_run: int | None = None
    refused: psycopg.Error | None = None


class Store:
    """The dashboard's only way to the database."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        owns_pool: bool,
        statement_timeout_ms: int,
        exact_counts_up_to: int,
        redactor: Redactor | None = None,
    ) -> None:
        self.pool = pool
        self.owns_pool = owns_pool
        self.statement_timeout_ms = statement_timeout_ms
        self.exact_counts_up_to = exact_counts_up_to
        self.redactor = redactor  # installed while the pool it opened from a DSN runs

    def version_problem(self) -> str | None:
        """What is wrong with the database's treadle for this package (older, newer, missing), or None."""
        with self.pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(EXTENSION_VERSION).fetchone()
            return version_problem(None if row is None else row[0], conn.info.dbname)

    def close(self) -> None:
        try:
            if self.owns_pool:
                self.pool.close()
        finally:
            if self.redactor is not None:
                self.redactor.remove()

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
            # the statement, not client.version: /health answers an unsupported version too
            row = cur.execute(_sql.VERSION).fetchone()
            return str(next(iter(row.values()))) if row else ""

    def overview(
        self, *, failures: int, runs: int, open_run: int | None, queue_offset: int = 0, queues: int = 50
    ) -> Overview | None:
        """The front page, with the queues ranked `queue_offset` + 1 to `queue_offset` + `queues`;
        None when `open_run` names no run."""
        with self._cursor(read_only=True) as cur:
            now = _now(cur)
            detail = _run_detail(cur, open_run) if open_run is not None else None
            if open_run is not None and detail is None:
                return None
            params = {"exact_up_to": self.exact_counts_up_to, "offset": queue_offset, "limit": queues}
            page = _counts(cur.execute(OVERVIEW_COUNTS, params).fetchall())
            return Overview(
                now=now,
                totals=page.totals,
                queues=page.queues,
                queue_count=page.queue_count,
                queue_offset=queue_offset,
                queue_limit=queues,
                paused_empty=page.paused_empty,
                throughput=cur.execute(THROUGHPUT).fetchall(),
                failures=cur.execute(RECENT_FAILURES, {"limit": failures}).fetchall(),
                runs=cur.execute(RECENT_RUNS, {"limit": runs}).fetchall(),
                workers=cur.execute(_sql.LIVE_WORKERS).fetchall(),
                open_run=detail,
                paused=page.paused,
            )

    def job(self, job_id: int) -> tuple[datetime, Row | None]:
        with self._cursor(read_only=True) as cur:
            return _now(cur), cur.execute(JOB, {"job_id": job_id}).fetchone()

    def explain(self, job_id: int) -> list[Row]:
        """treadle.explain's reasons: why the job is where it is (none for a job the role cannot see)."""
        with self._cursor(read_only=True) as cur:
            return cur.execute(_sql.EXPLAIN, {"job_id": job_id}).fetchall()

    def schedules(self) -> tuple[datetime, list[Row]]:
        with self._cursor(read_only=True) as cur:
            return _now(cur), cur.execute(_sql.SCHEDULES).fetchall()

    def pause_queue(self, queue: str) -> bool:
        with self._cursor(read_only=False) as cur:
            return bool(_via_client(client.pause, cur.connection, queue))

    def resume_queue(self, queue: str) -> bool:
        with self._cursor(read_only=False) as cur:
            return bool(_via_client(client.resume, cur.connection, queue))

    def set_queue(self, queue: str, limits: dict[str, Any]) -> Row | None:
        """Set every one of the queue's limits (QUEUE_LIMITS; None clears one); its settings after."""
        with self._cursor(read_only=False) as cur:
            _via_client(client.set_queue, cur.connection, queue, **{name: limits.get(name) for name in QUEUE_LIMITS})
            return cur.execute(_sql.QUEUE_SETTINGS_OF, {"queue": queue}).fetchone()

    def run(self, run_id: int) -> tuple[datetime, RunDetail | None]:
        with self._cursor(read_only=True) as cur:
            return _now(cur), _run_detail(cur, run_id)

    def search(self, where: SearchFilter, *, page_size: int, window: int) -> SearchPage:
        """A page of matches, newest first. A windowed search reads only the `window`
        newest jobs below `before`; when they hold fewer matches than a page, the next
        page reads the window below them."""
        params = where.params() | {"limit": page_size + 1, "floor": None}  # one more tells whether more exist
        with self._cursor(read_only=True) as cur:
            now = _now(cur)
            floor = None
            if where.windowed:
                floor = _window_floor(cur, where.before, window)
                params["floor"] = floor
            # never prepared: each search is planned for its own filters
            rows = cur.execute(SEARCH, params, prepare=False).fetchall()
        more = len(rows) > page_size
        rows = rows[:page_size]
        if more and rows:
            next_before = rows[-1]["id"]
        elif where.windowed and floor is not None:
            next_before = floor  # this window is read: the next page reads the one below
        else:
            next_before = None
        return SearchPage(
            now=now,
            jobs=rows,
            next_before=next_before,
            window=window if where.windowed else None,
            floor=floor,
        )

    def plan_bulk(self, where: SearchFilter, *, states: frozenset[str], window: int, limit: int) -> BulkPlan:
        """Count what a bulk action on this search would touch: the jobs in the states
        it applies to, among the `window` newest jobs below `before` (or, for an
        indexed search, every job it finds), at most `limit`."""
        with self._cursor(read_only=True) as cur:
            now = _now(cur)
            upto_row = cur.execute(NEWEST_ID, {"before": where.before}).fetchone()
            upto = upto_row["id"] if upto_row else None
            if upto is None:
                return BulkPlan(now=now, matches=0, more=False, upto=None, floor=None)
            # an indexed search is bounded by its index; anything else, by the window
            floor = None if where.indexed else _window_floor(cur, where.before, window)
            ids = self._bulk_ids(cur, where, states=states, upto=upto, floor=floor, limit=limit + 1)
        return BulkPlan(now=now, matches=min(len(ids), limit), more=len(ids) > limit, upto=upto, floor=floor)

    def act_in_bulk(
        self,
        action: str,
        where: SearchFilter,
        *,
        states: frozenset[str],
        upto: int,
        floor: int | None,
        limit: int,
        batch_size: int,
    ) -> BulkOutcome:
        """Retry or cancel the jobs plan_bulk counted (those that still match), newest
        first, `batch_size` to a transaction (client.retry_many, cancel_many), each under
        the dashboard's statement timeout. A refusal (a tenant's bounds, a missing grant)
        stops it after the batches done."""
        act = client.retry_many if action == "retry" else client.cancel_many
        with self._cursor(read_only=True) as cur:
            ids = self._bulk_ids(cur, where, states=states, upto=upto, floor=floor, limit=limit)
        done: list[tuple[int, int]] = []  # (jobs, changed) of each committed batch
        refused: psycopg.Error | None = None
        try:
            with self.pool.connection() as conn:
                act(
                    conn,
                    ids,
                    batch_size=batch_size,
                    on_batch=lambda jobs, changed: done.append((jobs, changed)),
                    statement_timeout=timedelta(milliseconds=self.statement_timeout_ms),
                )
        except psycopg.Error as error:
            refused = error
        attempted, changed = sum(jobs for jobs, _ in done), sum(changed for _, changed in done)
        return BulkOutcome(attempted, changed, len(done), len(ids), refused=refused)

    def _queue_counts(self, cur: psycopg.Cursor[Row], queue: str) -> QueueCounts:
        params: dict[str, Any] = {"queue": queue, "exact_up_to": self.exact_counts_up_to}
        small = cur.execute(TABLE_IS_SMALL, params).fetchone()
        counts: dict[str, StateCount] = {}
        if small is None or small["small"]:
            for row in cur.execute(QUEUE_EXACT_COUNTS, params).fetchall():
                counts[row["state"]] = StateCount(row["state"], int(row["jobs"]), False)
        else:
            estimates = cur.execute(QUEUE_ESTIMATES, params | {"states": list(JOB_STATES)}).fetchall()
            for row in estimates:
                counts[row["state"]] = StateCount(row["state"], int(row["jobs"]), True)
            exact = [
                r["state"] for r in estimates if r["state"] in WAITING and int(r["jobs"]) <= self.exact_counts_up_to
            ]
            counts.update({state: StateCount(state, 0, False) for state in exact})
            for row in cur.execute(QUEUE_WAITING_COUNTS, params | {"states": exact}).fetchall():
                counts[row["state"]] = StateCount(row["state"], int(row["jobs"]), False)
            running = cur.execute(QUEUE_RUNNING_COUNT, params).fetchone()
            counts["running"] = StateCount("running", int(running["jobs"]) if running else 0, False)
        age = cur.execute(QUEUE_OLDEST_WAITING, params).fetchone()
        return QueueCounts(queue, counts, age["age"] if age else None)

    @staticmethod
    def _bulk_ids(
        cur: psycopg.Cursor[Row],
        where: SearchFilter,
        *,
        states: frozenset[str],
        upto: int,
        floor: int | None,
        limit: int,
    ) -> list[int]:
        params = where.params() | {"upto": upto, "floor": floor, "states": sorted(states), "limit": limit}
        return [row["id"] for row in cur.execute(BULK_MATCHES, params, prepare=False).fetchall()]

    def queue(self, queue: str, *, failures: int) -> QueuePage:
        """One queue: its counts (estimated like the overview's), finished jobs per minute,
        its recent failures and the live workers that serve it."""
        with self._cursor(read_only=True) as cur:
            now = _now(cur)
            counts = self._queue_counts(cur, queue)
            return QueuePage(
                now=now,
                counts=counts,
                # an estimate is never below 1, so 1 may mean none
                exists=any(c.jobs > (1 if c.estimated else 0) for c in counts.counts.values()),
                throughput=cur.execute(QUEUE_THROUGHPUT, {"queue": queue}).fetchall(),
                failures=cur.execute(QUEUE_FAILURES, {"queue": queue, "limit": failures}).fetchall(),
                workers=cur.execute(_sql.QUEUE_WORKERS, {"queue": queue}).fetchall(),
                settings=cur.execute(_sql.QUEUE_SETTINGS_OF, {"queue": queue}).fetchone(),
            )

    def retry_job(self, job_id: int) -> Outcome:
        return self._act_on_job(client.retry, job_id)

    def cancel_job(self, job_id: int) -> Outcome:
        return self._act_on_job(client.cancel, job_id)

    def cancel_run(self, run_id: int) -> Outcome:
        with self._cursor(read_only=False) as cur:
            changed = bool(_via_client(client.cancel_workflow, cur.connection, run_id))
            row = cur.execute(RUN_STATE, {"run_id": run_id}).fetchone()
        return Outcome(changed=changed, state=row["state"] if row else None)

    def retry_run(self, run_id: int) -> RunOutcome:
        """treadle.retry_run: the run's state after it, or why it was refused (P0002, 55000)."""
        try:
            with self._cursor(read_only=False) as cur:
                return RunOutcome(state=str(_via_client(client.retry_run, cur.connection, run_id)))
        except (psycopg.errors.NoDataFound, psycopg.errors.ObjectNotInPrerequisiteState) as error:
            return RunOutcome(refused=error)

    def compensate_run(self, run_id: int) -> RunOutcome:
        """treadle.compensate_run: the run's state after it, or why it was refused (P0002, 55000)."""
        try:
            with self._cursor(read_only=False) as cur:
                return RunOutcome(state=str(_via_client(client.compensate_run, cur.connection, run_id)))
        except (psycopg.errors.NoDataFound, psycopg.errors.ObjectNotInPrerequisiteState) as error:
            return RunOutcome(refused=error)

    def fork_run(self, run_id: int, from_step: str) -> RunOutcome:
        """treadle.fork_run: the new run's id, or why it was refused (P0002, 22023)."""
        try:
            with self._cursor(read_only=False) as cur:
                new_run: Any = _via_client(client.fork_run, cur.connection, run_id, from_step)
                return RunOutcome(new_run=int(new_run))
        except (psycopg.errors.NoDataFound, psycopg.errors.InvalidParameterValue) as error:
            return RunOutcome(refused=error)

    def _act_on_job(self, act: Callable[[psycopg.Connection[Any], int], bool], job_id: int) -> Outcome:
        with self._cursor(read_only=False) as cur:
            changed = bool(_via_client(act, cur.connection, job_id))
            row = cur.execute(JOB_STATE, {"job_id": job_id}).fetchone()
        if row is None:
            return Outcome(changed=changed, state=None)
        return Outcome(changed=changed, state=row["state"], cancel_requested=row["cancel_requested"])


def _now(cur: psycopg.Cursor[Row]) -> datetime:
    row = cur.execute(NOW).fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


def _window_floor(cur: psycopg.Cursor[Row], before: int | None, window: int) -> int | None:
    row = cur.execute(WINDOW_FLOOR, {"before": before, "window": window}).fetchone()
    return int(row["id"]) if row else None


def _via_client(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A client function's result; the database's refusal re-raised as the psycopg error it was
    (the client maps 22023 and 22004 to InvalidArgument; the views answer psycopg errors)."""
    try:
        return call(*args, **kwargs)
    except TreadleError as error:
        if isinstance(error.__cause__, psycopg.Error):
            raise error.__cause__ from None
        raise


def _run_detail(cur: psycopg.Cursor[Row], run_id: int) -> RunDetail | None:
    run = cur.execute(RUN, {"run_id": run_id}).fetchone()
    if run is None:
        return None
    return RunDetail(run=run, steps=cur.execute(RUN_STEPS, {"run_id": run_id}).fetchall())


@dataclass(frozen=True)
class CountsPage:
    totals: list[StateCount]
    queues: list[QueueCounts]  # in rank order
    queue_count: int  # the queues that have jobs, on every page
    paused: frozenset[str]  # the paused queues among `queues` and `paused_empty`
    paused_empty: list[str]


def _counts(rows: list[Row]) -> CountsPage:
    """Split OVERVIEW_COUNTS rows into the per-state totals, the page's queues and the paused ones."""
    totals = {state: StateCount(state, 0, False) for state in JOB_STATES}
    queues: dict[str, QueueCounts] = {}
    paused: set[str] = set()
    paused_empty: list[str] = []
    queue_count = 0
    for row in rows:
        if row["state"] is None:  # a paused queue with no jobs
            paused_empty.append(row["queue"])
            paused.add(row["queue"])
            continue
        count = StateCount(row["state"], int(row["jobs"]), bool(row["estimated"]))
        queue_count = max(queue_count, int(row["queue_count"] or 0))
        if row["queue"] is None:
            totals[count.state] = count
            continue
        entry = queues.setdefault(row["queue"], QueueCounts(row["queue"]))
        entry.counts[count.state] = count
        entry.oldest_available_age = row["oldest_available_age"]
        if row["paused"]:
            paused.add(row["queue"])
    return CountsPage(
        [totals[s] for s in JOB_STATES], list(queues.values()), queue_count, frozenset(paused), paused_empty
    )
