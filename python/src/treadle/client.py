"""The producer side: enqueue jobs, start workflows, control them and read their results.

The transactional contract
--------------------------
Every function here takes the caller's connection and runs one statement inside
the caller's transaction. treadle never commits and never rolls back: a job
enqueued in a transaction exists once that transaction commits and never existed
if it rolls back, so a job and the rows it is about are saved together or not at
all::

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders (id) VALUES (%s)", [order_id])
        treadle.enqueue(conn, "send_receipt", {"order": order_id})

On an autocommit connection outside a transaction block, each call is a
transaction of its own. Workers cannot see a job before its transaction commits.

Connections
-----------
- a psycopg ``Connection``: the call runs and returns its value;
- a psycopg ``AsyncConnection``: the call returns an awaitable
  (``job_id = await treadle.enqueue(aconn, "send", {...})``);
- a SQLAlchemy ``Connection`` or ``Session`` on the psycopg driver
  (``postgresql+psycopg://``): the call joins SQLAlchemy's transaction, beginning
  it as SQLAlchemy's autobegin would, so ``session.commit()`` commits the job with
  the session's rows and ``session.rollback()`` discards both. With SQLAlchemy's
  asyncio extension, pass the psycopg connection underneath::

      raw = await (await session.connection()).get_raw_connection()
      job_id = await treadle.enqueue(raw.driver_connection, "send", {...})

Errors
------
Arguments are checked before anything is sent. A value of the wrong type, or a
payload JSON cannot hold exactly (NaN, infinity, sets, bytes, circular
structures, non-string keys), raises `InvalidArgument` and leaves the connection
and its transaction exactly as they were. A value the SQL layer refuses (an empty
name, ``max_attempts`` below 1, an ``every`` of zero, ...) raises `InvalidArgument`
with the database's SQLSTATE (22023 or 22004) on ``.sqlstate``; like any failed
statement, that aborts the caller's transaction, which then needs a rollback.

The first call on a connection checks the installed extension with one read of
``pg_extension`` (a query that cannot fail, so the transaction stays usable) and
raises `ExtensionMissing` or `UnsupportedVersion`, each naming the fix; a
connection that passed is not asked again.

Results
-------
A handler's return value is stored as its job's result. `wait` blocks until a job
finishes and returns that result, `wait_workflow` until a workflow run finishes and
returns its steps' results; `watch` tells a consumer when to look again.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, overload

import psycopg

from . import _args, _conn, _json, _sql, _wait, _watch
from ._watch import WatchEvent
from .errors import InvalidArgument
from .models import Job

if TYPE_CHECKING:
    from ._conn import AnyConnection, SyncConnection

__all__ = [
    "WatchEvent",
    "cancel",
    "cancel_workflow",
    "enqueue",
    "enqueue_many",
    "get_job",
    "retry",
    "start_workflow",
    "version",
    "wait",
    "wait_workflow",
    "watch",
    "workflow_results",
]

JsonPayload: TypeAlias = Mapping[str, Any] | Sequence[Any] | None
AsyncConnection: TypeAlias = "psycopg.AsyncConnection[Any]"

_ENQUEUE_KEYS = ("name", "args", "queue", "priority", "run_at", "max_attempts", "idempotency_key", "every")


# -- enqueue --------------------------------------------------------------------------------


@overload
def enqueue(
    conn: AsyncConnection,
    name: str,
    args: JsonPayload = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | timedelta | None = None,
    max_attempts: int = 25,
    idempotency_key: str | None = None,
    every: timedelta | None = None,
) -> Awaitable[int]: ...
@overload
def enqueue(
    conn: SyncConnection,
    name: str,
    args: JsonPayload = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | timedelta | None = None,
    max_attempts: int = 25,
    idempotency_key: str | None = None,
    every: timedelta | None = None,
) -> int: ...
def enqueue(
    conn: AnyConnection,
    name: str,
    args: JsonPayload = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | timedelta | None = None,
    max_attempts: int = 25,
    idempotency_key: str | None = None,
    every: timedelta | None = None,
) -> int | Awaitable[int]:
    """Enqueue one job in the caller's transaction and return its id.

    ``args`` is a JSON object or array (None means ``{}``). ``run_at`` is an aware
    datetime, or a timedelta counted from the database's clock; None means now.
    Lower ``priority`` runs first. With an ``idempotency_key`` that a job already
    holds, no job is added and that job's id is returned, whatever its state.
    ``every`` makes the job periodic: each occurrence that finishes enqueues the
    next one ``every`` later.
    """
    moment = _args.moment(run_at, "run_at")
    params = {
        "name": _args.text(name, "name"),
        "args": _json.to_jsonb(args, "args"),
        "queue": _args.text(queue, "queue"),
        "priority": _args.integer(priority, "priority"),
        "run_at": moment if isinstance(moment, datetime) else None,
        "delay": moment if isinstance(moment, timedelta) else None,
        "max_attempts": _args.integer(max_attempts, "max_attempts"),
        "idempotency_key": _args.optional_text(idempotency_key, "idempotency_key"),
        "every": _args.interval(every, "every"),
    }
    return _conn.execute(conn, _sql.ENQUEUE, params, _scalar)


@overload
def enqueue_many(conn: AsyncConnection, jobs: Iterable[Mapping[str, Any]]) -> Awaitable[list[int]]: ...
@overload
def enqueue_many(conn: SyncConnection, jobs: Iterable[Mapping[str, Any]]) -> list[int]: ...
def enqueue_many(conn: AnyConnection, jobs: Iterable[Mapping[str, Any]]) -> list[int] | Awaitable[list[int]]:
    """Enqueue many jobs in one statement, in the caller's transaction; ids in input order.

    Each job is a dict with `enqueue`'s keyword names (``name`` required) and the
    same kinds of values. An idempotency key that a job holds, or that an earlier
    element of the same call uses, gives that job's id. If any element is refused,
    no job is added.
    """
    if isinstance(jobs, (str, bytes, Mapping)) or not isinstance(jobs, Iterable):
        raise InvalidArgument(f"jobs must be a list of dicts, not {type(jobs).__name__}")
    specs = [_job_spec(index, spec) for index, spec in enumerate(jobs)]
    delayed = any(isinstance(spec, dict) and "run_in" in spec for spec in specs)
    query = _sql.ENQUEUE_MANY_DELAYED if delayed else _sql.ENQUEUE_MANY
    return _conn.execute(conn, query, {"jobs": _json.to_jsonb(specs, "jobs")}, _ids)


def _job_spec(index: int, spec: Any) -> Any:
    """One element of enqueue_many's JSON: values checked, times turned into text."""
    if not isinstance(spec, Mapping):
        return spec  # the SQL layer refuses it and names the element
    where = f"jobs[{index}]"
    unknown = [key for key in spec if key not in _ENQUEUE_KEYS]
    if unknown:
        raise InvalidArgument(
            f"{where} has {', '.join(map(repr, unknown))}, which enqueue does not take; "
            f"the keys are {', '.join(_ENQUEUE_KEYS)}"
        )
    out: dict[str, Any] = {}
    for key, value in spec.items():
        label = f"{where}[{key!r}]"
        if key in ("name", "queue"):
            out[key] = _args.text(value, label)
        elif key == "idempotency_key":
            out[key] = _args.optional_text(value, label)
        elif key in ("priority", "max_attempts"):
            out[key] = _args.integer(value, label)
        elif key == "run_at":
            moment = _args.moment(value, label)
            if isinstance(moment, timedelta):
                out["run_in"] = _args.interval_text(moment)  # resolved against the database's clock
            elif moment is not None:
                out["run_at"] = moment.isoformat()
        elif key == "every":
            every = _args.interval(value, label)
            if every is not None:
                out["every"] = _args.interval_text(every)
        else:
            out[key] = value  # args: checked with the whole document
    return out


# -- workflows ------------------------------------------------------------------------------


@overload
def start_workflow(
    conn: AsyncConnection,
    name: str,
    input: JsonPayload = None,
    *,
    steps: Sequence[str] | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 25,
    idempotency_key: str | None = None,
) -> Awaitable[int]: ...
@overload
def start_workflow(
    conn: SyncConnection,
    name: str,
    input: JsonPayload = None,
    *,
    steps: Sequence[str] | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 25,
    idempotency_key: str | None = None,
) -> int: ...
def start_workflow(
    conn: AnyConnection,
    name: str,
    input: JsonPayload = None,
    *,
    steps: Sequence[str] | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 25,
    idempotency_key: str | None = None,
) -> int | Awaitable[int]:
    """Start a workflow run in the caller's transaction and return the run id.

    The run's steps are ``steps``, or when None the ones a worker registered for
    ``name``. Its first step is enqueued now; each completed step enqueues the
    next. A workflow idempotency key (apart from jobs' keys) that a run holds
    returns that run's id and starts nothing.
    """
    params = {
        "name": _args.text(name, "name"),
        "input": _json.to_jsonb(input, "input"),
        "steps": _args.names(steps, "steps"),
        "queue": _args.text(queue, "queue"),
        "priority": _args.integer(priority, "priority"),
        "max_attempts": _args.integer(max_attempts, "max_attempts"),
        "idempotency_key": _args.optional_text(idempotency_key, "idempotency_key"),
    }
    return _conn.execute(conn, _sql.START_WORKFLOW, params, _scalar)


@overload
def cancel_workflow(conn: AsyncConnection, run_id: int) -> Awaitable[bool]: ...
@overload
def cancel_workflow(conn: SyncConnection, run_id: int) -> bool: ...
def cancel_workflow(conn: AnyConnection, run_id: int) -> bool | Awaitable[bool]:
    """Cancel a running workflow run: its waiting step now, or its running step when that ends.

    True when this call changed something; False for an unknown run, one that has
    finished, or one whose cancel was already asked.
    """
    return _conn.execute(conn, _sql.CANCEL_WORKFLOW, {"run_id": _args.row_id(run_id, "run_id")}, _scalar)


@overload
def workflow_results(conn: AsyncConnection, run_id: int) -> Awaitable[dict[str, Any] | None]: ...
@overload
def workflow_results(conn: SyncConnection, run_id: int) -> dict[str, Any] | None: ...
def workflow_results(conn: AnyConnection, run_id: int) -> dict[str, Any] | Awaitable[dict[str, Any] | None] | None:
    """The finished steps' results keyed by step name ({} before any finished); None for an unknown run."""
    return _conn.execute(conn, _sql.WORKFLOW_RESULTS, {"run_id": _args.row_id(run_id, "run_id")}, _scalar)


# -- jobs -----------------------------------------------------------------------------------


@overload
def cancel(conn: AsyncConnection, job_id: int) -> Awaitable[bool]: ...
@overload
def cancel(conn: SyncConnection, job_id: int) -> bool: ...
def cancel(conn: AnyConnection, job_id: int) -> bool | Awaitable[bool]:
    """Cancel a waiting job now, or ask a running one to stop (it ends as cancelled).

    True when this call changed something; False for a finished job, one whose
    cancel was already asked, or an unknown id.
    """
    return _conn.execute(conn, _sql.CANCEL, {"job_id": _args.row_id(job_id, "job_id")}, _scalar)


@overload
def retry(conn: AsyncConnection, job_id: int) -> Awaitable[bool]: ...
@overload
def retry(conn: SyncConnection, job_id: int) -> bool: ...
def retry(conn: AnyConnection, job_id: int) -> bool | Awaitable[bool]:
    """Make a discarded, cancelled or retryable job available now, with its attempts reset.

    True when it did; False for any other state or an unknown id. A retried
    workflow step resumes its run.
    """
    return _conn.execute(conn, _sql.RETRY, {"job_id": _args.row_id(job_id, "job_id")}, _scalar)


@overload
def get_job(conn: AsyncConnection, job_id: int) -> Awaitable[Job | None]: ...
@overload
def get_job(conn: SyncConnection, job_id: int) -> Job | None: ...
def get_job(conn: AnyConnection, job_id: int) -> Job | Awaitable[Job | None] | None:
    """The job as it is now in the caller's transaction, or None for an unknown id."""
    return _conn.execute(conn, _sql.GET_JOB, {"job_id": _args.row_id(job_id, "job_id")}, _job)


@overload
def version(conn: AsyncConnection) -> Awaitable[str]: ...
@overload
def version(conn: SyncConnection) -> str: ...
def version(conn: AnyConnection) -> str | Awaitable[str]:
    """The installed SQL API's version, after the same check every call makes.

    Raises ExtensionMissing or UnsupportedVersion (whose message gives the
    installed version) instead of returning a version this client cannot use.
    """
    return _conn.execute(conn, _sql.VERSION, {}, _scalar)


# -- results --------------------------------------------------------------------------------


@overload
def wait(
    conn_or_dsn: AsyncConnection,
    job_id: int,
    timeout: float | timedelta | None = None,
    *,
    poll_interval: float | timedelta = 1.0,
    listen: bool = True,
) -> Awaitable[Any]: ...
@overload
def wait(
    conn_or_dsn: str | SyncConnection,
    job_id: int,
    timeout: float | timedelta | None = None,
    *,
    poll_interval: float | timedelta = 1.0,
    listen: bool = True,
) -> Any: ...
def wait(
    conn_or_dsn: str | AnyConnection,
    job_id: int,
    timeout: float | timedelta | None = None,
    *,
    poll_interval: float | timedelta = 1.0,
    listen: bool = True,
) -> Any:
    """Block until the job finishes and return its result (awaitable with an AsyncConnection).

    Raises JobFailed (discarded after its last attempt; ``.error`` is the last
    error), JobCancelled, JobNotFound, or WaitTimeout once ``timeout`` seconds
    have passed; a timeout never touches the job, so waiting again later works.

    The job row is read on a timer every ``poll_interval`` seconds, and at once
    when a treadle_done notification names its queue; notifications are hints,
    never trusted for the outcome. With a DSN, wait opens (and closes) a
    connection of its own and LISTENs there. With a connection: it LISTENs on it
    only when it is autocommit, outside a transaction and listening to nothing
    else (undone afterwards); otherwise it polls without disturbing the caller's
    transaction, which must then be READ COMMITTED. Waiting inside a transaction
    for a job that same transaction enqueued never ends: no worker sees the job
    before the commit. ``listen=False`` polls only, for poolers that lose
    notifications (PgBouncer in transaction mode); a LISTEN the server refuses
    falls back to polling by itself.
    """
    job = _args.row_id(job_id, "job_id")
    limit, interval = _wait_times(timeout, poll_interval, listen)
    return _wait_on(conn_or_dsn, _wait.job(job), _wait.outcome(job, limit, interval), listen)


@overload
def wait_workflow(
    conn_or_dsn: AsyncConnection,
    run_id: int,
    timeout: float | timedelta | None = None,
    *,
    poll_interval: float | timedelta = 1.0,
    listen: bool = True,
) -> Awaitable[dict[str, Any]]: ...
@overload
def wait_workflow(
    conn_or_dsn: str | SyncConnection,
    run_id: int,
    timeout: float | timedelta | None = None,
    *,
    poll_interval: float | timedelta = 1.0,
    listen: bool = True,
) -> dict[str, Any]: ...
def wait_workflow(
    conn_or_dsn: str | AnyConnection,
    run_id: int,
    timeout: float | timedelta | None = None,
    *,
    poll_interval: float | timedelta = 1.0,
    listen: bool = True,
) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """Block until the workflow run finishes and return its results (awaitable with an AsyncConnection).

    The results are the finished steps' results keyed by step name, as
    `workflow_results` gives them. Raises WorkflowFailed (``.step`` is the step
    whose job was discarded, ``.error`` that job's last error), WorkflowCancelled,
    WorkflowNotFound, or WaitTimeout once ``timeout`` seconds have passed; a
    timeout never touches the run.

    The run is read as `wait` reads a job, and the connection is used the same
    way: every ``poll_interval`` seconds, and at once when a treadle_done
    notification names the run's queue (where its steps run). Waiting inside the
    transaction that started the run never ends: no worker sees its first step
    before the commit.
    """
    run = _args.row_id(run_id, "run_id")
    limit, interval = _wait_times(timeout, poll_interval, listen)
    return _wait_on(conn_or_dsn, _wait.workflow_run(run), _wait.run_outcome(run, limit, interval), listen)


def _wait_times(timeout: Any, poll_interval: Any, listen: Any) -> tuple[float | None, float]:
    """The checked timeout and poll interval, in seconds; a listen that is not a bool is refused too."""
    limit = None if timeout is None else _args.seconds(timeout, "timeout", allow_zero=True)
    interval = _args.seconds(poll_interval, "poll_interval", allow_zero=False)
    if not isinstance(listen, bool):
        raise InvalidArgument(f"listen must be True or False, not {type(listen).__name__}")
    return limit, interval


def _wait_on(conn_or_dsn: str | AnyConnection, watched: _wait.Watched, loop: _wait.Loop, listen: bool) -> Any:
    if isinstance(conn_or_dsn, str):
        return _wait.wait_dsn(conn_or_dsn, watched, loop, listen)
    if isinstance(conn_or_dsn, psycopg.AsyncConnection):
        return _wait.wait_async(conn_or_dsn, watched, loop, listen)
    return _wait.wait_connection(_conn.sync_connection(conn_or_dsn), watched, loop, listen)


@overload
def watch(
    dsn: str,
    queues: Iterable[str] | None,
    callback: None = None,
    *,
    poll_interval: float | timedelta = 2.0,
    listen: bool = True,
    stop: threading.Event | None = None,
) -> Iterator[WatchEvent]: ...
@overload
def watch(
    dsn: str,
    queues: Iterable[str] | None,
    callback: Callable[[WatchEvent], object],
    *,
    poll_interval: float | timedelta = 2.0,
    listen: bool = True,
    stop: threading.Event | None = None,
) -> None: ...
def watch(
    dsn: str,
    queues: Iterable[str] | None,
    callback: Callable[[WatchEvent], object] | None = None,
    *,
    poll_interval: float | timedelta = 2.0,
    listen: bool = True,
    stop: threading.Event | None = None,
) -> Iterator[WatchEvent] | None:
    """Signal that jobs on ``queues`` (None: every queue) may have changed.

    Events are `WatchEvent` tuples: ``("queued", queue)`` when work became
    claimable, ``("done", queue)`` when jobs finished, ``("poll", None)`` every
    ``poll_interval`` seconds whatever LISTEN does. A signal means "re-read now";
    the database holds the answer. The first event is a poll sent once listening
    has begun, and another follows each reconnection, so a consumer that re-reads
    on every event never misses a change. ``listen=False`` (or a LISTEN the
    server refuses) leaves the timer alone.

    With a ``callback``, calls it for each event until ``stop`` (a
    threading.Event) is set, then returns; without one, returns an iterator of
    events that ends when ``stop`` is set or the consumer stops iterating. The
    connection (opened from ``dsn``, closed at the end) is only for LISTEN and
    the extension check.
    """
    if not isinstance(dsn, str):
        raise InvalidArgument(f"dsn must be a connection string, not {type(dsn).__name__}")
    names = _watched_queues(queues)
    interval = _args.seconds(poll_interval, "poll_interval", allow_zero=False)
    if not isinstance(listen, bool):
        raise InvalidArgument(f"listen must be True or False, not {type(listen).__name__}")
    if stop is not None and not isinstance(stop, threading.Event):
        raise InvalidArgument(f"stop must be a threading.Event, not {type(stop).__name__}")
    if callback is not None and not callable(callback):
        raise InvalidArgument(f"callback must be callable, not {type(callback).__name__}")
    events = _watch.events(dsn, names, interval, listen, stop)
    if callback is None:
        return events
    with closing(events):  # a callback that raises still closes the connection at once
        for event in events:
            callback(event)
    return None


def _watched_queues(queues: Iterable[str] | None) -> frozenset[str] | None:
    if queues is None:
        return None
    checked = _args.names(queues, "queues")
    assert checked is not None
    if not checked or any(not name.strip() for name in checked):
        raise InvalidArgument("queues must be None (every queue) or a list of non-empty queue names")
    return frozenset(checked)


# -- reading rows ---------------------------------------------------------------------------


def _scalar(rows: _conn.Rows) -> Any:
    return next(iter(rows[0].values()))


def _ids(rows: _conn.Rows) -> list[int]:
    return [row["id"] for row in rows]


def _job(rows: _conn.Rows) -> Job | None:
    return Job.from_row(rows[0]) if rows else None
