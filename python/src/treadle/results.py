"""Waiting for what jobs and workflow runs became: `wait`, `wait_workflow` and `watch`.

`wait` and `wait_workflow` take the caller's connection (sync or async) or a DSN;
`watch` takes a DSN. Each reads the database for the truth, and uses LISTEN only
as a hint to read sooner: on `listen_dsn` when given (a direct connection to the
server, when the others go through a transaction-mode pooler such as PgBouncer,
where notifications never arrive), else on its own connection when that reaches
the server directly; otherwise it polls every `poll_interval`.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Generator, Iterable
from contextlib import closing
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict, overload

import psycopg

from . import _args, _conn, _wait, _watch
from ._watch import WatchEvent
from .errors import InvalidArgument

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._conn import AnyConnection, SyncConnection

__all__ = ["WaitOptions", "WatchEvent", "wait", "wait_workflow", "watch"]

AsyncConnection = psycopg.AsyncConnection


class WaitOptions(TypedDict, total=False):
    """The keyword options of `wait` and `wait_workflow`."""

    poll_interval: float | timedelta  # read at least this often (default 1 s)
    listen: bool  # LISTEN for hints to read sooner (default True); False polls only
    listen_dsn: str | None  # LISTEN on this connection string instead (a direct one beside a pooler)


_WAIT_DEFAULTS: WaitOptions = {"poll_interval": 1.0, "listen": True, "listen_dsn": None}


@overload
def wait(
    conn_or_dsn: AsyncConnection[Any],
    job_id: int,
    timeout: float | timedelta | None = None,
    **options: Unpack[WaitOptions],
) -> Awaitable[Any]: ...
@overload
def wait(
    conn_or_dsn: str | SyncConnection,
    job_id: int,
    timeout: float | timedelta | None = None,
    **options: Unpack[WaitOptions],
) -> Any: ...
def wait(
    conn_or_dsn: str | AnyConnection,
    job_id: int,
    timeout: float | timedelta | None = None,
    **options: Unpack[WaitOptions],
) -> Any:
    """Block until the job finishes and return its result (awaitable with an AsyncConnection).

    Raises JobFailed (discarded after its last attempt; ``.error`` is the last
    error), JobCancelled, JobNotFound, UndecodablePayload (a stored result this
    client cannot decode), or WaitTimeout once ``timeout`` seconds have passed; a
    timeout never touches the job, so waiting again later works.

    The job row is read on a timer every ``poll_interval`` seconds, and at once
    when a treadle_done notification names its queue; notifications are hints,
    never trusted for the outcome. With a DSN, wait opens (and closes) a
    connection of its own and LISTENs there. With a connection: it LISTENs on it
    only when it is autocommit, outside a transaction, listening to nothing else
    and reaching the server directly (undone afterwards); otherwise it polls
    without disturbing the caller's transaction, which must then be READ
    COMMITTED. Waiting inside a transaction for a job that same transaction
    enqueued never ends: no worker sees the job before the commit.
    ``listen_dsn`` LISTENs on a connection of its own to that DSN instead;
    ``listen=False`` polls only. A LISTEN the server refuses falls back to polling.
    """
    job = _args.row_id(job_id, "job_id")
    limit, interval, listen, listen_dsn = _wait_options(timeout, options)
    return _wait_on(conn_or_dsn, _wait.job(job), _wait.outcome(job, limit, interval), listen, listen_dsn)


@overload
def wait_workflow(
    conn_or_dsn: AsyncConnection[Any],
    run_id: int,
    timeout: float | timedelta | None = None,
    **options: Unpack[WaitOptions],
) -> Awaitable[dict[str, Any]]: ...
@overload
def wait_workflow(
    conn_or_dsn: str | SyncConnection,
    run_id: int,
    timeout: float | timedelta | None = None,
    **options: Unpack[WaitOptions],
) -> dict[str, Any]: ...
def wait_workflow(
    conn_or_dsn: str | AnyConnection,
    run_id: int,
    timeout: float | timedelta | None = None,
    **options: Unpack[WaitOptions],
) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """Block until the workflow run finishes and return its results (awaitable with an AsyncConnection).

    The results are the finished steps' results keyed by step name, as
    `workflow_results` gives them. Raises WorkflowFailed (``.step`` is the step
    whose job was discarded, ``.error`` that job's last error; also for a run that
    ended ``compensated``), WorkflowCancelled,
    WorkflowNotFound, UndecodablePayload, or WaitTimeout once ``timeout`` seconds
    have passed; a timeout never touches the run.

    The run is read as `wait` reads a job, and the connection is used the same
    way: every ``poll_interval`` seconds, and at once when a treadle_done
    notification names the run's queue (where its steps run). Waiting inside the
    transaction that started the run never ends: no worker sees its first step
    before the commit. A run that ended while a child run of it still runs (a
    cancel reaches a running step only when it finishes) is waited for until its
    children are done too.
    """
    run = _args.row_id(run_id, "run_id")
    limit, interval, listen, listen_dsn = _wait_options(timeout, options)
    results: dict[str, Any] | Awaitable[dict[str, Any]] = _wait_on(
        conn_or_dsn, _wait.workflow_run(run), _wait.run_outcome(run, limit, interval), listen, listen_dsn
    )
    return results


def _wait_options(timeout: Any, options: WaitOptions) -> tuple[float | None, float, bool, str | None]:
    """The checked timeout and options (seconds, bool, DSN)."""
    unknown = [key for key in options if key not in _WAIT_DEFAULTS]
    if unknown:
        raise TypeError(f"wait() got an unexpected keyword argument {unknown[0]!r}")
    given = {**_WAIT_DEFAULTS, **options}
    limit = None if timeout is None else _args.seconds(timeout, "timeout", allow_zero=True)
    interval = _args.seconds(given["poll_interval"], "poll_interval", allow_zero=False)
    return limit, interval, _flag(given["listen"], "listen"), _listen_dsn(given["listen_dsn"])


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, not {type(value).__name__}")
    return value


def _listen_dsn(value: object) -> str | None:
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise InvalidArgument(f"listen_dsn must be a connection string or None, not {type(value).__name__}")
    return value


def _wait_on(
    conn_or_dsn: str | AnyConnection, watched: _wait.Watched, loop: _wait.Loop, listen: bool, listen_dsn: str | None
) -> Any:
    if isinstance(conn_or_dsn, str):
        return _wait.wait_dsn(conn_or_dsn, watched, loop, listen, listen_dsn)
    if isinstance(conn_or_dsn, psycopg.AsyncConnection):
        return _wait.wait_async(conn_or_dsn, watched, loop, listen, listen_dsn)
    return _wait.wait_connection(_conn.sync_connection(conn_or_dsn), watched, loop, listen, listen_dsn)


@overload
def watch(
    dsn: str,
    queues: Iterable[str] | None,
    callback: None = None,
    *,
    poll_interval: float | timedelta = 2.0,
    listen: bool = True,
    stop: threading.Event | None = None,
    listen_dsn: str | None = None,
) -> Generator[WatchEvent, None, None]: ...
@overload
def watch(
    dsn: str,
    queues: Iterable[str] | None,
    callback: Callable[[WatchEvent], object],
    *,
    poll_interval: float | timedelta = 2.0,
    listen: bool = True,
    stop: threading.Event | None = None,
    listen_dsn: str | None = None,
) -> None: ...
def watch(
    dsn: str,
    queues: Iterable[str] | None,
    callback: Callable[[WatchEvent], object] | None = None,
    *,
    poll_interval: float | timedelta = 2.0,
    listen: bool = True,
    stop: threading.Event | None = None,
    listen_dsn: str | None = None,
) -> Generator[WatchEvent, None, None] | None:
    """Signal that jobs on ``queues`` (None: every queue) may have changed.

    Events are `WatchEvent` tuples: ``("queued", queue)`` when work became
    claimable, ``("done", queue)`` when jobs finished, ``("poll", None)`` every
    ``poll_interval`` seconds whatever LISTEN does. A signal means "re-read now";
    the database holds the answer. The first event is a poll sent once listening
    has begun, and another follows each reconnection, so a consumer that re-reads
    on every event never misses a change. ``listen=False`` (or a LISTEN the
    server refuses, or a ``dsn`` through a pooler without ``listen_dsn``) leaves
    the timer alone.

    With a ``callback``, calls it for each event until ``stop`` (a
    threading.Event) is set, then returns; without one, returns a generator of
    events that ends when ``stop`` is set, the consumer stops iterating, or its
    ``close()`` is called. The connection (opened from ``listen_dsn`` or ``dsn``,
    closed at the end) is only for LISTEN and the extension check.
    """
    if not isinstance(dsn, str):
        raise InvalidArgument(f"dsn must be a connection string, not {type(dsn).__name__}")
    names = _watched_queues(queues)
    interval = _args.seconds(poll_interval, "poll_interval", allow_zero=False)
    _flag(listen, "listen")
    if stop is not None and not isinstance(stop, threading.Event):
        raise InvalidArgument(f"stop must be a threading.Event, not {type(stop).__name__}")
    if callback is not None and not callable(callback):
        raise InvalidArgument(f"callback must be callable, not {type(callback).__name__}")
    events = _watch.events(dsn, names, interval, listen, stop, _listen_dsn(listen_dsn))
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
