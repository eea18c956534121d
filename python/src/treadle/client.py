"""The producer side: enqueue jobs, start workflows, control them and read their results.

The transactional contract
--------------------------
Every function here takes the caller's connection and runs one statement inside
the caller's transaction (the waits, which may also take a DSN, are in `results`).
treadle never commits and never rolls back: a job enqueued in a transaction exists
once that transaction commits and never existed if it rolls back, so a job and the
rows it is about are saved together or not at all::

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders (id) VALUES (%s)", [order_id])
        treadle.enqueue(conn, "send_receipt", {"order": order_id})

On an autocommit connection outside a transaction block, each call is a
transaction of its own. Workers cannot see a job before its transaction commits.
`retry_many` and `cancel_many` are the exception: on a connection outside a
transaction they make each batch a transaction of its own, so that acting on
thousands of jobs never holds their row locks at once.

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
A handler's return value is stored as its job's result: `results.wait`,
`results.wait_workflow` and `results.watch` (also `treadle.wait`, ...) read them.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypedDict, overload

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from . import _args, _conn, _json, _otel, _sql
from ._registry import sleep_until, step_options_entry
from .errors import InvalidArgument, JobNotFound, WorkflowNotFound
from .models import Explanation, Job, RunExplanation

if TYPE_CHECKING:
    from typing_extensions import LiteralString, Unpack

    from ._conn import AnyConnection, SyncConnection

__all__ = [
    "EnqueueOptions",
    "WorkflowOptions",
    "cancel",
    "cancel_many",
    "cancel_workflow",
    "enqueue",
    "enqueue_many",
    "explain",
    "explain_run",
    "get_job",
    "pause",
    "resume",
    "retry",
    "retry_many",
    "set_queue",
    "start_workflow",
    "version",
    "workflow_results",
    "workflow_step_results",
]

JsonPayload: TypeAlias = Mapping[str, Any] | Sequence[Any] | None
AsyncConnection: TypeAlias = "psycopg.AsyncConnection[Any]"
# retry_many's and cancel_many's report after each committed batch: (jobs in it, of those changed)
OnBatch: TypeAlias = Callable[[int, int], None]
# enqueue's on_conflict and unique_while (docs/queues.md, "Keys that merge")
OnConflict: TypeAlias = Literal["keep", "replace", "replace_args", "append"]
UniqueWhile: TypeAlias = Literal["waiting", "active", "retained"]
BATCH_SIZE: Final = 500


class EnqueueOptions(TypedDict, total=False):
    """`enqueue`'s keyword options (and the keys of an `enqueue_many` element besides name and args)."""

    queue: str  # default "default"
    priority: int  # default 0; lower runs first
    run_at: datetime | timedelta | None  # an aware datetime, or a delay on the database's clock; None: now
    max_attempts: int  # default 25
    idempotency_key: str | None
    every: timedelta | None  # periodic: each finished occurrence enqueues the next one `every` later
    timeout: timedelta | None  # how long one attempt may run; None: no limit (docs/retries.md)
    backoff: Sequence[timedelta] | None  # delays before retries 1, 2, ... (the last repeats); None: the default
    on_conflict: OnConflict  # default "keep": what a call does when a waiting job holds its key (docs/queues.md)
    unique_while: UniqueWhile  # default "retained": while the job holds its key
    unique_period: timedelta | None  # the key is taken per period of the database's clock; None: for good
    meta: Mapping[str, Any] | None  # metadata for the handler and tools (a JSON object); None: none
    concurrency_key: str | None  # its key's lane: at most the queue's key_limit of one key at once (docs/queues.md)


class WorkflowOptions(TypedDict, total=False):
    """`start_workflow`'s keyword options."""

    steps: Sequence[str] | None  # default: the steps a worker registered for the name
    after: Mapping[str, Sequence[str]] | None  # step -> the steps it runs after; None: each after the one before
    # sleep step -> how long it waits (no handler runs it), or the datetime it waits until, or
    # {"input": key}: until the time the input holds under key
    sleeps: Mapping[str, timedelta | datetime | Mapping[str, str]] | None
    maps: Mapping[str, str | Mapping[str, str]] | None  # map step -> a step (its result, a list), or {"input": key}
    queue: str
    priority: int
    max_attempts: int
    idempotency_key: str | None
    # wait step -> the signal it waits for, or {"signal": name, "timeout": timedelta, "on_timeout": "continue"}
    waits: Mapping[str, str | Mapping[str, str | timedelta]] | None
    children: Mapping[str, str | Mapping[str, str]] | None  # child step -> a workflow, or {"workflow": .., "queue": ..}
    compensations: Mapping[str, str] | None  # step -> the name of its compensating step
    # step -> its job options: queue, priority, max_attempts, timeout (timedelta), backoff (timedeltas),
    # concurrency_key
    step_options: Mapping[str, Mapping[str, Any]] | None
    meta: Mapping[str, Any] | None  # the run's metadata (a JSON object), on every step job's ctx.meta; None: none


ENQUEUE_DEFAULTS: Final[EnqueueOptions] = {
    "queue": "default",
    "priority": 0,
    "run_at": None,
    "max_attempts": 25,
    "idempotency_key": None,
    "every": None,
    "timeout": None,
    "backoff": None,
    "on_conflict": "keep",
    "unique_while": "retained",
    "unique_period": None,
    "meta": None,
    "concurrency_key": None,
}
WORKFLOW_DEFAULTS: Final[WorkflowOptions] = {
    "steps": None,
    "after": None,
    "sleeps": None,
    "maps": None,
    "queue": "default",
    "priority": 0,
    "max_attempts": 25,
    "idempotency_key": None,
    "waits": None,
    "children": None,
    "compensations": None,
    "step_options": None,
    "meta": None,
}
_ENQUEUE_KEYS = ("name", "args", *ENQUEUE_DEFAULTS)


def _with_defaults(function: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    unknown = [key for key in options if key not in defaults]
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    return {**defaults, **options}


# -- enqueue --------------------------------------------------------------------------------


@overload
def enqueue(
    conn: AsyncConnection, name: str, args: JsonPayload = None, **options: Unpack[EnqueueOptions]
) -> Awaitable[int]: ...
@overload
def enqueue(conn: SyncConnection, name: str, args: JsonPayload = None, **options: Unpack[EnqueueOptions]) -> int: ...
def enqueue(
    conn: AnyConnection, name: str, args: JsonPayload = None, **options: Unpack[EnqueueOptions]
) -> int | Awaitable[int]:
    """Enqueue one job in the caller's transaction and return its id.

    ``args`` is a JSON object or array (None means ``{}``). ``run_at`` is an aware
    datetime, or a timedelta counted from the database's clock; None means now.
    Lower ``priority`` runs first. With an ``idempotency_key`` that a job of the
    same queue already holds, no job is added and that job's id is returned,
    whatever its state. ``every`` makes the job periodic: each occurrence that
    finishes enqueues the next one ``every`` later. ``timeout`` bounds how long
    one attempt may run, and ``backoff`` lists the delays before retries 1, 2, ...
    (jittered; the last one repeats): docs/retries.md. ``on_conflict`` chooses
    what a call does when a waiting job holds its key: "keep" it, "replace" its
    args and run_at (debounce), "replace_args" (throttle), or "append" the arrays
    of ``args`` to its own (batch); a job that runs or has finished is never
    changed, and a new job takes the key. ``unique_while`` ("waiting", "active",
    "retained") and ``unique_period`` bound how long a job holds its key:
    docs/queues.md. ``meta`` is a JSON object stored with the job (its handler
    reads ``ctx.meta``; a periodic job's next occurrence keeps it); with the
    ``otel`` extra, the current trace context is added to it (docs/concepts.md,
    "Tracing"). ``concurrency_key`` puts the job in that key's lane: at most
    the queue's ``key_limit`` jobs of one key run at once, the others wait
    ("blocked") and are released oldest first (docs/queues.md, "Concurrency
    keys"). The options and their defaults: `EnqueueOptions`.
    """
    if not options:
        # The common call, every option at its default: two parameters, and the
        # function's own defaults (the same as ENQUEUE_DEFAULTS) for the rest.
        traced = _otel.with_trace_context(None)
        if traced is None:
            short = {"name": _args.text(name, "name"), "args": _json.to_jsonb(args, "args")}
            return _conn.execute_scalar(conn, _sql.ENQUEUE_AT_DEFAULTS, short)  # type: ignore[no-any-return]
    given = _with_defaults("enqueue", options, ENQUEUE_DEFAULTS)
    moment = _args.moment(given["run_at"], "run_at")
    params = {
        "name": _args.text(name, "name"),
        "args": _json.to_jsonb(args, "args"),
        "queue": _args.text(given["queue"], "queue"),
        "priority": _args.integer(given["priority"], "priority"),
        "run_at": moment if isinstance(moment, datetime) else None,
        "delay": moment if isinstance(moment, timedelta) else None,
        "max_attempts": _args.integer(given["max_attempts"], "max_attempts"),
        "idempotency_key": _args.optional_text(given["idempotency_key"], "idempotency_key"),
        "every": _args.interval(given["every"], "every"),
        "timeout": _args.interval(given["timeout"], "timeout"),
        "backoff": _args.intervals(given["backoff"], "backoff"),
        "on_conflict": _args.text(given["on_conflict"], "on_conflict"),
        "unique_while": _args.text(given["unique_while"], "unique_while"),
        "unique_period": _args.interval(given["unique_period"], "unique_period"),
        "meta": _json.to_jsonb(_otel.with_trace_context(_meta(given["meta"], "meta")), "meta"),
        "concurrency_key": _args.optional_text(given["concurrency_key"], "concurrency_key"),
    }
    return _conn.execute(conn, _sql.ENQUEUE, params, _scalar)


def _meta(value: Any, label: str) -> Any:
    """enqueue's meta: a mapping (as a dict) or None; anything else is refused here."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{label} must be a dict (a JSON object), not {type(value).__name__}")
    return dict(value)


@overload
def enqueue_many(conn: AsyncConnection, jobs: Iterable[Mapping[str, Any]]) -> Awaitable[list[int]]: ...
@overload
def enqueue_many(conn: SyncConnection, jobs: Iterable[Mapping[str, Any]]) -> list[int]: ...
def enqueue_many(conn: AnyConnection, jobs: Iterable[Mapping[str, Any]]) -> list[int] | Awaitable[list[int]]:
    """Enqueue many jobs in one statement, in the caller's transaction; ids in input order.

    Each job is a dict with ``name``, ``args`` and `EnqueueOptions`' keys, with the
    same kinds of values as `enqueue`. An idempotency key that a job of the same
    queue holds, or that an earlier element of the same call uses, gives that
    job's id (or, with ``on_conflict``, merges into it as `enqueue` would, in
    input order). If any element is refused, no job is added.
    """
    if isinstance(jobs, (str, bytes, Mapping)) or not isinstance(jobs, Iterable):
        raise InvalidArgument(f"jobs must be a list of dicts, not {type(jobs).__name__}")
    jobs = list(jobs)
    params = _array_params(jobs)
    if params is not None:
        return _conn.execute(conn, _sql.ENQUEUE_ARRAYS, params, _ids)
    specs = [_job_spec(index, spec) for index, spec in enumerate(jobs)]
    traced = _otel.trace_context()
    if traced:
        specs = [{**spec, "meta": {**traced, **(spec.get("meta") or {})}} if isinstance(spec, dict) else spec
                 for spec in specs]  # fmt: skip
    relative = any(isinstance(spec, dict) and isinstance(spec.get("run_at"), timedelta) for spec in specs)
    query = _sql.ENQUEUE_MANY if relative else _sql.ENQUEUE_MANY_AS_GIVEN
    return _conn.execute(conn, query, {"jobs": _json.to_jsonb([_as_json(spec) for spec in specs], "jobs")}, _ids)


# What treadle.enqueue_arrays takes: jobs that name only these go as one array per column
# (what the server inserts from, with nothing to unpack); the others as one JSON document.
_ARRAY_KEYS: Final = frozenset({"name", "args", "queue", "priority", "run_at", "max_attempts", "idempotency_key",
                                "every", "timeout", "meta", "concurrency_key"})  # fmt: skip
_ARRAY_COLUMNS: Final = tuple(sorted(_ARRAY_KEYS - {"name", "args", "meta"}))
_NAME_ARGS: Final = frozenset({"name", "args"})


def _array_params(jobs: list[Any]) -> dict[str, Any] | None:
    """enqueue_arrays' parameters for `jobs`, checked in one pass; None when a job needs enqueue_many's JSON.

    A job of only a name (a plain string) and args is taken as it is; any other goes
    through `_job_spec`, so every bad value raises what it raises, job by job in
    order. args and meta go as one JSON array each, encoded at once (an error names
    the job); a column no job gives is left out (None).
    """
    names: list[Any] = []
    args: list[Any] = []
    others: list[tuple[int, dict[str, Any]]] = []  # the jobs with more than a name and args
    plain = _NAME_ARGS
    for index, spec in enumerate(jobs):
        if type(spec) is dict and spec.keys() <= plain:
            name = spec.get("name")
            if type(name) is str and "\x00" not in name:
                names.append(name)
                args.append(spec.get("args"))
                continue
        checked = _job_spec(index, spec)
        if (not isinstance(checked, dict) or not checked.keys() <= _ARRAY_KEYS
                or isinstance(checked.get("run_at"), timedelta)):  # fmt: skip
            return None
        names.append(checked.get("name"))
        args.append(checked.get("args"))
        if not checked.keys() <= plain:
            others.append((index, checked))
    params: dict[str, Any] = {"name": names}
    _json_column(params, args, "args")
    for key in _ARRAY_COLUMNS:
        column = None
        for index, checked in others:
            value = checked.get(key)
            if value is not None:
                if column is None:
                    column = [None] * len(names)
                column[index] = value
        params[key] = column
    metas: list[Any] = [None] * len(names)
    for index, checked in others:
        metas[index] = checked.get("meta")
    traced = _otel.trace_context()
    if traced:
        metas = [{**traced, **(meta or {})} for meta in metas]
    _json_column(params, metas, "meta")
    return params


def _json_column(params: dict[str, Any], values: list[Any], key: str) -> None:
    """`key` as one JSON array of `values` (None as null, which enqueue_arrays reads as the default),
    or, past _ONE_DOCUMENT, as a list of jsonb (one jsonb value holds at most 256 MiB); None for all None."""
    params[key] = params[f"{key}_list"] = None
    if not any(map(operator.is_not, values, itertools.repeat(None))):  # (is, not ==: an element may define ==)
        return
    text = _json.array_text(values, lambda index: f"jobs[{index}][{key!r}]")
    if len(text) <= _ONE_DOCUMENT:
        params[key] = text
    else:
        params[f"{key}_list"] = [_json.to_jsonb(value, f"jobs[{index}][{key!r}]") for index, value in enumerate(values)]


_ONE_DOCUMENT: Final = 32 * 2**20  # characters of JSON sent as one document; more goes element by element


def _as_json(spec: Any) -> Any:
    """An element of enqueue_many's JSON: times and intervals as text, a delay as "run_in"."""
    if not isinstance(spec, dict):
        return spec  # the SQL layer refuses it and names the element
    out = dict(spec)
    run_at = out.get("run_at")
    if isinstance(run_at, timedelta):
        del out["run_at"]
        out["run_in"] = _args.interval_text(run_at)  # resolved against the database's clock
    elif isinstance(run_at, datetime):
        out["run_at"] = run_at.isoformat()
    for key in ("every", "timeout", "unique_period"):
        if isinstance(out.get(key), timedelta):
            out[key] = _args.interval_text(out[key])
    if out.get("backoff") is not None:
        out["backoff"] = [_args.interval_text(delay) for delay in out["backoff"]]
    return out


def _job_spec(index: int, spec: Any) -> Any:
    """One element of enqueue_many: values checked (times and intervals kept as Python's)."""
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
        if key == "args":
            out[key] = value  # checked as JSON when sent
            continue
        label = f"{where}[{key!r}]"
        if key in ("name", "queue", "on_conflict", "unique_while"):
            out[key] = _args.text(value, label)
        elif key in ("idempotency_key", "concurrency_key"):
            out[key] = _args.optional_text(value, label)
        elif key in ("priority", "max_attempts"):
            out[key] = _args.integer(value, label)
        elif key == "meta":
            out[key] = _meta(value, label)
        else:  # run_at, every, timeout, unique_period, backoff: None is the default, as the key left out
            checked = (_args.moment(value, label) if key == "run_at"
                       else _args.intervals(value, label) if key == "backoff"
                       else _args.interval(value, label))  # fmt: skip
            if checked is not None:
                out[key] = checked
    return out


# -- workflows ------------------------------------------------------------------------------


@overload
def start_workflow(
    conn: AsyncConnection, name: str, input: JsonPayload = None, **options: Unpack[WorkflowOptions]
) -> Awaitable[int]: ...
@overload
def start_workflow(
    conn: SyncConnection, name: str, input: JsonPayload = None, **options: Unpack[WorkflowOptions]
) -> int: ...
def start_workflow(
    conn: AnyConnection, name: str, input: JsonPayload = None, **options: Unpack[WorkflowOptions]
) -> int | Awaitable[int]:
    """Start a workflow run in the caller's transaction and return the run id.

    The run's steps are ``steps``, or when None the ones a worker registered for
    ``name``. ``after`` maps a step to the steps it runs after (a graph; a step it
    leaves out starts with the run); without it each step runs after the one
    before. ``sleeps`` maps a sleep step (no handler runs it) to how long the run waits
    there (a timedelta), or to when it wakes: a timezone-aware datetime, or ``{"input":
    key}``, the time the input holds under that key. ``maps`` maps a map step to a step
    it runs after whose result is a list (or to ``{"input": key}``, a list in the
    input): it runs once per element, and hands on their results in element order.
    ``waits`` maps a wait step (no handler runs it) to the signal it waits for (`signal`), or to
    ``{"signal": name, "timeout": timedelta}``: the run fails when no signal came in
    time (or, with ``"on_timeout": "continue"``, the step completes as
    ``{"timed_out": true}``). ``children`` maps a child step to a workflow name (or
    ``{"workflow": name, "queue": queue}``): it starts a run of that workflow and
    completes with its results. ``compensations`` maps a step to the name of its
    compensating step, run when the run fails for good (the run ends
    ``compensated``). ``step_options`` maps a step (or a compensating step) to its
    own job options: ``queue``, ``priority``, ``max_attempts``, ``timeout`` (a
    timedelta), ``backoff`` (a list of timedeltas) and ``concurrency_key``; the run's otherwise (it needs
    ``steps``: a registered workflow's steps carry their own). The steps it starts
    with are enqueued now; each completed step enqueues those whose dependencies
    have all completed. A workflow idempotency key (apart from jobs' keys) that a
    run holds returns that run's id and starts nothing. ``meta`` is the run's
    metadata, a JSON object copied to every step job's meta (``ctx.meta`` in a step;
    a child run inherits it); with the ``otel`` extra the current trace context is
    added to it, as enqueue adds it. The options and their defaults:
    `WorkflowOptions`.
    """
    given = _with_defaults("start_workflow", options, WORKFLOW_DEFAULTS)
    params = {
        "name": _args.text(name, "name"),
        "input": _json.to_jsonb(input, "input"),
        "steps": _args.names(given["steps"], "steps"),
        "after": _after(given["after"]),
        "sleeps": _sleeps(given["sleeps"]),
        "maps": _maps(given["maps"]),
        "waits": _waits(given["waits"]),
        "children": _children(given["children"]),
        "compensations": _compensations(given["compensations"]),
        "step_options": _step_options(given["step_options"]),
        "queue": _args.text(given["queue"], "queue"),
        "priority": _args.integer(given["priority"], "priority"),
        "max_attempts": _args.integer(given["max_attempts"], "max_attempts"),
        "idempotency_key": _args.optional_text(given["idempotency_key"], "idempotency_key"),
        "meta": _json.to_jsonb(_otel.with_trace_context(_meta(given["meta"], "meta")), "meta"),
    }
    return _conn.execute(conn, _sql.START_WORKFLOW, params, _scalar)


def _sleeps(value: Any) -> Jsonb | None:
    """start_workflow's `sleeps`: step name -> timedelta, datetime or {"input": key}; the database checks the bounds."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"sleeps must be a mapping of step name -> timedelta, not {type(value).__name__}")
    out: dict[str, Any] = {}
    for step, duration in value.items():
        if isinstance(duration, (datetime, Mapping)):
            out[_args.text(step, "sleeps' step")] = {"until": sleep_until(duration, f"sleeps[{step!r}]")}
            continue
        if not isinstance(duration, timedelta):
            raise InvalidArgument(
                f"sleeps[{step!r}] must be a datetime.timedelta, a datetime or {{'input': key}}, "
                f"not {type(duration).__name__}"
            )
        interval = f"{duration.days} days {duration.seconds} seconds {duration.microseconds} microseconds"
        out[_args.text(step, "sleeps' step")] = interval
    return Jsonb(out)


def _waits(value: Any) -> Jsonb | None:
    """start_workflow's `waits`: step -> signal name or {"signal": name, "timeout": timedelta}."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"waits must be a mapping of step name -> signal name, not {type(value).__name__}")
    out: dict[str, dict[str, str]] = {}
    for step, wait in value.items():
        spec = dict(wait) if isinstance(wait, Mapping) else {"signal": wait}
        timeout = spec.pop("timeout", None)
        signal_name = spec.pop("signal", None)
        on_timeout = spec.pop("on_timeout", None)
        if spec:
            raise InvalidArgument(f"waits[{step!r}] takes signal, timeout and on_timeout, not {next(iter(spec))!r}")
        entry = {"signal": _args.text(signal_name, f"waits[{step!r}]'s signal")}
        if on_timeout is not None:
            entry["on_timeout"] = _args.text(on_timeout, f"waits[{step!r}]'s on_timeout")  # the database checks it
        if timeout is not None:
            if not isinstance(timeout, timedelta):
                raise InvalidArgument(
                    f"waits[{step!r}]'s timeout must be a datetime.timedelta, not {type(timeout).__name__}"
                )
            entry["timeout"] = _args.interval_text(timeout)
        out[_args.text(step, "waits' step")] = entry
    return Jsonb(out)


def _maps(value: Any) -> Jsonb | None:
    """start_workflow's `maps`: step name -> step name or {"input": key}; the database checks the graph."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"maps must be a mapping of step name -> step name, not {type(value).__name__}")
    return Jsonb(
        {
            _args.text(step, "maps' step"): (
                {_args.text(k, "maps' key"): _args.text(v, "maps' input key") for k, v in over.items()}
                if isinstance(over, Mapping)
                else _args.text(over, "maps' step")
            )
            for step, over in value.items()
        }
    )


def _step_options(value: Any) -> Jsonb | None:
    """start_workflow's `step_options`: step name -> its options; the database checks the bounds."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"step_options must be a mapping of step name -> options, not {type(value).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for step, options in value.items():
        step_name = _args.text(step, "step_options' step")
        if not isinstance(options, Mapping):
            raise InvalidArgument(f"step_options[{step_name!r}] must be a mapping, not {type(options).__name__}")
        out[step_name] = step_options_entry(options, f"step_options[{step_name!r}]")
    return Jsonb(out)


def _compensations(value: Any) -> Jsonb | None:
    """start_workflow's `compensations`: step name -> compensation name; the database checks the rest."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            f"compensations must be a mapping of step name -> compensation name, not {type(value).__name__}"
        )
    return Jsonb(
        {_args.text(step, "compensations' step"): _args.text(name, "compensation name") for step, name in value.items()}
    )


def _children(value: Any) -> Jsonb | None:
    """start_workflow's `children`: step name -> workflow name or {"workflow": .., "queue": ..}; the database checks."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"children must be a mapping of step name -> workflow name, not {type(value).__name__}")
    return Jsonb(
        {
            _args.text(step, "children's step"): (
                {_args.text(k, "children's key"): _args.text(v, "children's value") for k, v in child.items()}
                if isinstance(child, Mapping)
                else {"workflow": _args.text(child, "child workflow")}
            )
            for step, child in value.items()
        }
    )


def _after(value: Any) -> Jsonb | None:
    """start_workflow's `after`: a mapping of step name -> step names; the database checks the graph."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"after must be a mapping of step name -> step names, not {type(value).__name__}")
    return Jsonb(
        {_args.text(step, "after's step"): _args.names(deps, f"after[{step!r}]") for step, deps in value.items()}
    )


@overload
def cancel_workflow(conn: AsyncConnection, run_id: int) -> Awaitable[bool]: ...
@overload
def cancel_workflow(conn: SyncConnection, run_id: int) -> bool: ...
def cancel_workflow(conn: AnyConnection, run_id: int) -> bool | Awaitable[bool]:
    """Cancel a running workflow run: its waiting step now, or its running step when that ends.

    True when this call changed something; False for an unknown run, one that has
    finished, or one whose cancel was already asked. Raises
    psycopg.errors.SerializationFailure (40001), having cancelled nothing, when other
    sessions kept changing the run's tree while it locked it: retry it.
    """
    return _conn.execute(conn, _sql.CANCEL_WORKFLOW, {"run_id": _args.row_id(run_id, "run_id")}, _scalar)


@overload
def retry_run(conn: AsyncConnection, run_id: int) -> Awaitable[str]: ...
@overload
def retry_run(conn: SyncConnection, run_id: int) -> str: ...
def retry_run(conn: AnyConnection, run_id: int) -> str | Awaitable[str]:
    """Retry a failed or cancelled workflow run from its failed steps; returns its state now.

    "running": its discarded and cancelled steps run again (attempt 0) and what was
    waiting for them follows; "compensating": its failed compensation runs again.
    Completed steps keep their results and never run again. The operator's call
    (treadle.grant_admin, or a dashboard role that may act). Raises
    psycopg.errors.NoDataFound (P0002) for an unknown run and
    psycopg.errors.ObjectNotInPrerequisiteState (55000) for one that is not failed or
    cancelled (a compensated run's steps were undone: fork it instead).
    """
    return _conn.execute(conn, _sql.RETRY_RUN, {"run_id": _args.row_id(run_id, "run_id")}, _scalar)


@overload
def compensate_run(conn: AsyncConnection, run_id: int) -> Awaitable[str]: ...
@overload
def compensate_run(conn: SyncConnection, run_id: int) -> str: ...
def compensate_run(conn: AnyConnection, run_id: int) -> str | Awaitable[str]:
    """Run the compensations of a cancelled workflow run's completed steps; returns its state now.

    "compensating" (its compensations run, last completed step first), or "compensated"
    when it has nothing to undo. The operator's call. Raises psycopg.errors.NoDataFound
    (P0002) for an unknown run, psycopg.errors.ObjectNotInPrerequisiteState (55000) for
    one that is not cancelled (a cancel still under way too) or has no compensations.
    """
    return _conn.execute(conn, _sql.COMPENSATE_RUN, {"run_id": _args.row_id(run_id, "run_id")}, _scalar)


@overload
def cancel_run(conn: AsyncConnection, run_id: int, *, compensate: bool = False) -> Awaitable[str]: ...
@overload
def cancel_run(conn: SyncConnection, run_id: int, *, compensate: bool = False) -> str: ...
def cancel_run(conn: AnyConnection, run_id: int, *, compensate: bool = False) -> str | Awaitable[str]:
    """Cancel a running workflow run; with compensate=True undo its completed steps too; returns its state now.

    Without compensate: "cancelled", or "running" while a running step's cancel is
    under way (as cancel_workflow). With compensate, in one transaction: a running
    run becomes "compensating" (its waiting steps cancelled, its running steps'
    cancel requested; its compensations run, last completed step first, once none
    runs), or "compensated" when it has nothing to undo; a cancelled run is
    compensated as by compensate_run. The operator's call. Raises
    psycopg.errors.NoDataFound (P0002) for an unknown run and
    psycopg.errors.ObjectNotInPrerequisiteState (55000) for one that is not running
    (nor cancelled, with compensate), whose cancel was already requested (without
    compensate) or that has no compensations (with compensate).
    """
    params = {"run_id": _args.row_id(run_id, "run_id"), "compensate": _args.boolean(compensate, "compensate")}
    return _conn.execute(conn, _sql.CANCEL_RUN, params, _scalar)


@overload
def fork_run(conn: AsyncConnection, run_id: int, from_step: str, *, input: JsonPayload = None) -> Awaitable[int]: ...
@overload
def fork_run(conn: SyncConnection, run_id: int, from_step: str, *, input: JsonPayload = None) -> int: ...
def fork_run(conn: AnyConnection, run_id: int, from_step: str, *, input: JsonPayload = None) -> int | Awaitable[int]:
    """Start a new run of a run's pinned definition from `from_step`; returns the new run's id.

    The new run carries the results the source recorded for every step that is
    neither `from_step` nor a step after it (directly or through others); those never
    run in it. `from_step` and the steps after it run again. Its input is the
    source's, or `input`. The source is not changed; the new run's `forked_from`
    names it. The operator's call. Raises psycopg.errors.NoDataFound (P0002) for an
    unknown run, InvalidArgument for a step the run does not have or a bad input.
    """
    params = {
        "run_id": _args.row_id(run_id, "run_id"),
        "from_step": _args.text(from_step, "from_step"),
        "input": _json.to_jsonb(input, "input"),
    }
    return _conn.execute(conn, _sql.FORK_RUN, params, _scalar)


@overload
def signal(conn: AsyncConnection, run_id: int, name: str, payload: JsonPayload = None) -> Awaitable[str]: ...
@overload
def signal(conn: SyncConnection, run_id: int, name: str, payload: JsonPayload = None) -> str: ...
def signal(conn: AnyConnection, run_id: int, name: str, payload: JsonPayload = None) -> str | Awaitable[str]:
    """Send the signal `name` to a workflow run, in the caller's transaction (rolled back: never sent).

    Returns what became of it: "delivered" (a wait step for it was waiting, and
    completed with `payload` as its result), "kept" (a wait step for it has not
    started; it takes the signal when it does), "ignored" (the run waits for no
    further signal of that name), "finished" (the run is not running) or "unknown"
    (no such run). Only "delivered" and "kept" write anything.
    """
    params = {
        "run_id": _args.row_id(run_id, "run_id"),
        "name": _args.text(name, "name"),
        "payload": _json.to_jsonb(payload, "payload"),
    }
    return _conn.execute(conn, _sql.SIGNAL, params, _scalar)


@overload
def signal_by_key(
    conn: AsyncConnection, queue: str, idempotency_key: str, name: str, payload: JsonPayload = None
) -> Awaitable[str]: ...
@overload
def signal_by_key(
    conn: SyncConnection, queue: str, idempotency_key: str, name: str, payload: JsonPayload = None
) -> str: ...
def signal_by_key(
    conn: AnyConnection, queue: str, idempotency_key: str, name: str, payload: JsonPayload = None
) -> str | Awaitable[str]:
    """`signal` for the run started in `queue` with the workflow idempotency key `idempotency_key`."""
    params = {
        "queue": _args.text(queue, "queue"),
        "idempotency_key": _args.text(idempotency_key, "idempotency_key"),
        "name": _args.text(name, "name"),
        "payload": _json.to_jsonb(payload, "payload"),
    }
    return _conn.execute(conn, _sql.SIGNAL_BY_KEY, params, _scalar)


@overload
def workflow_results(conn: AsyncConnection, run_id: int) -> Awaitable[dict[str, Any] | None]: ...
@overload
def workflow_results(conn: SyncConnection, run_id: int) -> dict[str, Any] | None: ...
def workflow_results(conn: AnyConnection, run_id: int) -> dict[str, Any] | Awaitable[dict[str, Any] | None] | None:
    """The finished steps' results keyed by step name ({} before any finished); None for an unknown run."""
    return _conn.execute(conn, _sql.WORKFLOW_RESULTS, {"run_id": _args.row_id(run_id, "run_id")}, _scalar)


@overload
def workflow_step_results(conn: AsyncConnection, run_id: int, step: str) -> Awaitable[dict[str, Any] | None]: ...
@overload
def workflow_step_results(conn: SyncConnection, run_id: int, step: str) -> dict[str, Any] | None: ...
def workflow_step_results(
    conn: AnyConnection, run_id: int, step: str
) -> dict[str, Any] | Awaitable[dict[str, Any] | None] | None:
    """What `step` receives: the results of the steps it runs after, directly or not, keyed by step
    name ({} for a step without dependencies or not of the run); None for an unknown run."""
    params = {"run_id": _args.row_id(run_id, "run_id"), "step": _args.text(step, "step")}
    return _conn.execute(conn, _sql.WORKFLOW_STEP_RESULTS, params, _scalar)


@overload
def explain_run(conn: AsyncConnection, run_id: int) -> Awaitable[list[RunExplanation]]: ...
@overload
def explain_run(conn: SyncConnection, run_id: int) -> list[RunExplanation]: ...
def explain_run(conn: AnyConnection, run_id: int) -> list[RunExplanation] | Awaitable[list[RunExplanation]]:
    """Why a workflow run is where it is: `RunExplanation`s, in words (treadle.explain_run).

    The first sums the run up (step None, reason "run"); a finished run has that
    one alone. Then each step that has not completed says what it waits for: its
    dependencies, a sleep, a signal, a map's element jobs, or what `explain` says
    of its job. Raises `WorkflowNotFound` for an id the caller cannot see.
    """
    run_id = _args.row_id(run_id, "run_id")

    def read(rows: _conn.Rows) -> list[RunExplanation]:
        if not rows:
            raise WorkflowNotFound(run_id)
        return [
            RunExplanation(
                step=row["step"], job_id=row["job_id"], reason=row["reason"], message=row["message"], at=row["at"]
            )
            for row in rows
        ]

    return _conn.execute(conn, _sql.EXPLAIN_RUN, {"run_id": run_id}, read)


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
def retry_many(
    conn: AsyncConnection,
    ids: Iterable[int],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: OnBatch | None = None,
    statement_timeout: timedelta | None = None,
) -> Awaitable[int]: ...
@overload
def retry_many(
    conn: SyncConnection,
    ids: Iterable[int],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: OnBatch | None = None,
    statement_timeout: timedelta | None = None,
) -> int: ...
def retry_many(
    conn: AnyConnection,
    ids: Iterable[int],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: OnBatch | None = None,
    statement_timeout: timedelta | None = None,
) -> int | Awaitable[int]:
    """`retry` each job of `ids`, `batch_size` jobs to a transaction; how many it retried.

    See `cancel_many` for the batches, the callback and the errors.
    """
    return _act_on_many(conn, _sql.RETRY_MANY, ids, batch_size, on_batch, statement_timeout)


@overload
def cancel_many(
    conn: AsyncConnection,
    ids: Iterable[int],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: OnBatch | None = None,
    statement_timeout: timedelta | None = None,
) -> Awaitable[int]: ...
@overload
def cancel_many(
    conn: SyncConnection,
    ids: Iterable[int],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: OnBatch | None = None,
    statement_timeout: timedelta | None = None,
) -> int: ...
def cancel_many(
    conn: AnyConnection,
    ids: Iterable[int],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: OnBatch | None = None,
    statement_timeout: timedelta | None = None,
) -> int | Awaitable[int]:
    """`cancel` each job of `ids`, `batch_size` jobs to a transaction; how many it changed.

    On a psycopg connection outside a transaction (autocommit, or idle) each batch
    is a transaction of its own, committed before the next begins, so no batch
    holds many row locks for long; a failed batch is rolled back and its error
    raised, and the batches before it stay committed. Inside the caller's
    transaction (a SQLAlchemy Connection or Session is always in one) the batches
    are statements of it, like any other call's, and the caller's commit decides.
    After each batch ``on_batch(jobs, changed)`` is called with its size and how
    many of it changed. ``statement_timeout`` bounds each batch's statement (set
    for the transaction it runs in, so inside the caller's, until that ends). Ids
    are acted on in the order given; an unknown one changes nothing.

    A list (any collection) of ids is checked whole before anything is sent; an
    iterator is read and checked a batch at a time, so it may read the next ids
    from the database once the batch before is done. A value that is not an
    integer raises `InvalidArgument`.
    """
    return _act_on_many(conn, _sql.CANCEL_MANY, ids, batch_size, on_batch, statement_timeout)


def _act_on_many(
    conn: AnyConnection,
    query: LiteralString,
    ids: Iterable[int],
    batch_size: int,
    on_batch: OnBatch | None,
    statement_timeout: timedelta | None,
) -> int | Awaitable[int]:
    if _args.integer(batch_size, "batch_size") < 1:
        raise InvalidArgument(f"batch_size must be at least 1, got {batch_size}")
    if on_batch is not None and not callable(on_batch):
        raise InvalidArgument(f"on_batch must be a function or None, not {type(on_batch).__name__}")
    timeout = _args.interval(statement_timeout, "statement_timeout")
    if timeout is not None and timeout <= timedelta(0):
        raise InvalidArgument(f"statement_timeout must be positive, got {timeout}")
    # whole milliseconds, rounded up: a timeout of 0 would mean none
    limit = None if timeout is None else f"{math.ceil(timeout / timedelta(milliseconds=1))}ms"
    batches = _id_batches(ids, batch_size)
    if isinstance(conn, psycopg.AsyncConnection):
        return _act_on_many_async(conn, query, batches, on_batch, limit)
    target = _conn.sync_connection(conn)
    # a transaction per batch, unless the caller has one (SQLAlchemy's may not have reached the server yet)
    own = conn is target and target.info.transaction_status == TransactionStatus.IDLE
    changed = 0
    for batch in batches:
        with target.transaction() if own else nullcontext():
            if limit is not None:
                _conn.execute(target, _sql.BATCH_TIMEOUT, {"timeout": limit}, _nothing)
            done: int = _conn.execute(target, query, {"ids": batch}, _scalar)
        changed += done
        if on_batch is not None:
            on_batch(len(batch), done)
    return changed


async def _act_on_many_async(
    conn: psycopg.AsyncConnection[Any],
    query: LiteralString,
    batches: Iterator[list[int]],
    on_batch: OnBatch | None,
    limit: str | None,
) -> int:
    own = conn.info.transaction_status == TransactionStatus.IDLE
    changed = 0
    for batch in batches:
        async with conn.transaction() if own else nullcontext():
            if limit is not None:
                await _conn.execute(conn, _sql.BATCH_TIMEOUT, {"timeout": limit}, _nothing)
            done: int = await _conn.execute(conn, query, {"ids": batch}, _scalar)
        changed += done
        if on_batch is not None:
            on_batch(len(batch), done)
    return changed


def _id_batches(ids: Any, size: int) -> Iterator[list[int]]:
    """Job ids in lists of `size`: a collection checked whole now, an iterator as each list is taken."""
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
        raise InvalidArgument(f"ids must be a list of job ids, not {type(ids).__name__}")
    if isinstance(ids, Collection):
        checked = [_args.row_id(value, f"ids[{index}]") for index, value in enumerate(ids)]
        return iter([checked[start : start + size] for start in range(0, len(checked), size)])
    return _checked_batches(iter(ids), size)


def _checked_batches(ids: Iterator[Any], size: int) -> Iterator[list[int]]:
    taken = 0
    # islice takes `size` ids and no more: the next are read only when the next batch is due
    while batch := [_args.row_id(value, f"ids[{taken + n}]") for n, value in enumerate(itertools.islice(ids, size))]:
        taken += len(batch)
        yield batch


@overload
def get_job(conn: AsyncConnection, job_id: int) -> Awaitable[Job | None]: ...
@overload
def get_job(conn: SyncConnection, job_id: int) -> Job | None: ...
def get_job(conn: AnyConnection, job_id: int) -> Job | Awaitable[Job | None] | None:
    """The job as it is now in the caller's transaction, or None for an unknown id.

    Read from treadle.job_details, which every reader role may select: the job's
    lease token (a running worker's write credential) is not part of it.
    """
    return _conn.execute(conn, _sql.GET_JOB, {"job_id": _args.row_id(job_id, "job_id")}, _job)


@overload
def explain(conn: AsyncConnection, job_id: int) -> Awaitable[list[Explanation]]: ...
@overload
def explain(conn: SyncConnection, job_id: int) -> list[Explanation]: ...
def explain(conn: AnyConnection, job_id: int) -> list[Explanation] | Awaitable[list[Explanation]]:
    """Why the job is where it is: one `Explanation` per reason, in words (treadle.explain).

    A waiting job says what holds it (not due, its queue paused or at a limit, no
    live worker on its queue, jobs ahead of it) or that nothing does; a running
    one where and until when; a finished one how it ended. Raises `JobNotFound`
    for an id the caller cannot see.
    """
    job_id = _args.row_id(job_id, "job_id")

    def read(rows: _conn.Rows) -> list[Explanation]:
        if not rows:
            raise JobNotFound(job_id)
        return [Explanation(reason=row["reason"], message=row["message"], at=row["at"]) for row in rows]

    return _conn.execute(conn, _sql.EXPLAIN, {"job_id": job_id}, read)


# -- queues ---------------------------------------------------------------------------------


@overload
def pause(conn: AsyncConnection, queue: str) -> Awaitable[bool]: ...
@overload
def pause(conn: SyncConnection, queue: str) -> bool: ...
def pause(conn: AnyConnection, queue: str) -> bool | Awaitable[bool]:
    """Pause a queue: workers claim none of its jobs (running ones go on); enqueue still works.

    True when it was not paused before.
    """
    return _conn.execute(conn, _sql.PAUSE, {"queue": _args.text(queue, "queue")}, _scalar)


@overload
def resume(conn: AsyncConnection, queue: str) -> Awaitable[bool]: ...
@overload
def resume(conn: SyncConnection, queue: str) -> bool: ...
def resume(conn: AnyConnection, queue: str) -> bool | Awaitable[bool]:
    """Resume a paused queue (its workers are woken). True when it was paused."""
    return _conn.execute(conn, _sql.RESUME, {"queue": _args.text(queue, "queue")}, _scalar)


@overload
def set_queue(
    conn: AsyncConnection,
    queue: str,
    *,
    concurrency: int | None = None,
    rate_limit: int | None = None,
    rate_period: timedelta | None = None,
    max_depth: int | None = None,
    retain_completed: timedelta | None = None,
    retain_failed: timedelta | None = None,
    key_limit: int | None = None,
    key_ordered: bool = False,
) -> Awaitable[None]: ...
@overload
def set_queue(
    conn: SyncConnection,
    queue: str,
    *,
    concurrency: int | None = None,
    rate_limit: int | None = None,
    rate_period: timedelta | None = None,
    max_depth: int | None = None,
    retain_completed: timedelta | None = None,
    retain_failed: timedelta | None = None,
    key_limit: int | None = None,
    key_ordered: bool = False,
) -> None: ...
def set_queue(
    conn: AnyConnection,
    queue: str,
    *,
    concurrency: int | None = None,
    rate_limit: int | None = None,
    rate_period: timedelta | None = None,
    max_depth: int | None = None,
    retain_completed: timedelta | None = None,
    retain_failed: timedelta | None = None,
    key_limit: int | None = None,
    key_ordered: bool = False,
) -> Awaitable[None] | None:
    """Set a queue's limits and retention to exactly these; a setting left out is none.

    ``concurrency``: at most this many of its jobs running at once, over every
    worker. ``rate_limit`` per ``rate_period``: at most that many claims, with
    bursts up to ``rate_limit``. ``max_depth``: an enqueue that would leave more
    waiting jobs raises `QueueFull`. ``retain_completed`` and ``retain_failed``:
    how long finished jobs are kept. ``key_limit``: at most this many jobs of one
    ``concurrency_key`` released at once (None: 1); ``key_ordered``: each key is
    an ordered lane (one at a time, in enqueue order; a head that fails for good
    blocks its lane until it is retried or cancelled). Whether the queue is
    paused does not change.
    """
    params = {
        "queue": _args.text(queue, "queue"),
        "concurrency": None if concurrency is None else _args.integer(concurrency, "concurrency"),
        "rate_limit": None if rate_limit is None else _args.integer(rate_limit, "rate_limit"),
        "rate_period": _args.interval(rate_period, "rate_period"),
        "max_depth": None if max_depth is None else _args.integer(max_depth, "max_depth"),
        "retain_completed": _args.interval(retain_completed, "retain_completed"),
        "retain_failed": _args.interval(retain_failed, "retain_failed"),
        "key_limit": None if key_limit is None else _args.integer(key_limit, "key_limit"),
        "key_ordered": _args.boolean(key_ordered, "key_ordered"),
    }
    return _conn.execute(conn, _sql.SET_QUEUE, params, _nothing)


# -- the extension --------------------------------------------------------------------------


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


# -- reading rows ---------------------------------------------------------------------------


def _scalar(rows: _conn.Rows) -> Any:
    return next(iter(rows[0].values()))


def _nothing(rows: _conn.Rows) -> None:
    return None


def _ids(rows: _conn.Rows) -> list[int]:
    return [row["id"] for row in rows]


def _job(rows: _conn.Rows) -> Job | None:
    """A job_details row, its JSON columns (read as text) decoded one by one."""
    if not rows:
        return None
    row = rows[0]
    where = f"job {row['id']}'s"
    return Job.from_row(
        {
            **row,
            "args": _json.from_json(row["args"], f"{where} args"),
            "result": _json.from_json(row["result"], f"{where} result"),
            "errors": _json.from_json(row["errors"], f"{where} errors"),
            "meta": _json.from_json(row["meta"], f"{where} meta"),
        }
    )
