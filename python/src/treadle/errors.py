"""Exceptions, and the map from the extension's SQLSTATEs to them.

Every bad argument the SQL layer refuses arrives as SQLSTATE 22023
(invalid_parameter_value) or 22004 (null_value_not_allowed); the client raises
`InvalidArgument` for both, chained to the database error. An enqueue refused
because its queue is full (SQLSTATE TQ001, a queue's max_depth) raises `QueueFull`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg


class TreadleError(Exception):
    """Base class of every error treadle raises."""


class InvalidArgument(TreadleError, ValueError):
    """An argument was refused, by the client or by the SQL layer (22023, 22004)."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class QueueFull(TreadleError):
    """Backpressure: an enqueue would pass its queue's max_depth of waiting jobs (SQLSTATE TQ001).

    Nothing was written; slow down and try again later, or raise the limit with
    `set_queue`. Like any failed statement, it aborts the caller's transaction.
    """

    def __init__(self, message: str, sqlstate: str = "TQ001") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ExtensionMissing(TreadleError):
    """The database has no treadle extension installed."""


class UnsupportedVersion(TreadleError):
    """The installed extension's version is not one this client speaks."""


class UndecodablePayload(TreadleError, ValueError):
    """A stored JSON value (args, input, a result) that this client cannot decode, such as one
    nested deeper than Python's JSON decoder goes (rows written before 0.2.0 bounded the depth)."""


class LeaseLost(TreadleError):
    """The job's lease token no longer holds it: another worker or a rescue took it over."""


class JobCancelled(TreadleError):
    """The job was cancelled (raised by `wait`, and inside handlers by `ctx.check_cancelled()`)."""

    def __init__(self, job_id: int, message: str | None = None) -> None:
        super().__init__(message or f"job {job_id} was cancelled")
        self.job_id = job_id


class Discard(TreadleError):
    """Raised by a handler: this job cannot succeed, so discard it now instead of retrying.

    The attempt fails with this error and the job is discarded at once, with the
    attempts it had left unspent (treadle.fail with retryable => false). For input
    that will never be valid, a deleted record, a refused permission.
    """


class Snooze(TreadleError):
    """Raised by a handler: run this job again after `delay` (seconds or a timedelta).

    Not a failure: no error is recorded and the attempt is given back
    (treadle.snooze), so a job may snooze as often as it needs while it waits for
    something outside it. The delay is 0 to 366 days.
    """

    def __init__(self, delay: float | timedelta) -> None:
        from . import _args  # _args imports this module

        self.delay = timedelta(seconds=_args.seconds(delay, "Snooze delay", allow_zero=True))
        if self.delay > MAX_SNOOZE:
            raise InvalidArgument(f"Snooze delay must be at most {MAX_SNOOZE.days} days, got {self.delay}")
        super().__init__(f"snoozed for {self.delay.total_seconds():g} s")


MAX_SNOOZE = timedelta(days=366)  # treadle.snooze's bound


class JobTimeout(TreadleError, TimeoutError):
    """The attempt ran past its timeout: its handler was cancelled and the attempt failed with this."""

    def __init__(self, job_id: int, timeout: float) -> None:
        super().__init__(f"job {job_id} timed out: its attempt ran past its timeout of {timeout:g} s")
        self.job_id = job_id
        self.timeout = timeout


class JobFailed(TreadleError):
    """The job was discarded after its last attempt failed; `error` is its last error."""

    def __init__(self, job_id: int, error: str | None) -> None:
        super().__init__(f"job {job_id} failed: {error}")
        self.job_id = job_id
        self.error = error


class JobNotFound(TreadleError, LookupError):
    """No job has that id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class WaitTimeout(TreadleError, TimeoutError):
    """`wait` or `wait_workflow` gave up before the job or run finished, without touching it.

    `job_id` names the job `wait` waited for; `run_id` the run `wait_workflow`
    waited for; the other one is None.
    """

    def __init__(self, job_id: int | None, timeout: float, *, run_id: int | None = None) -> None:
        what = f"job {job_id}" if run_id is None else f"workflow run {run_id}"
        super().__init__(f"{what} did not finish within {timeout} s")
        self.job_id = job_id
        self.run_id = run_id
        self.timeout = timeout


class WorkflowCancelled(TreadleError):
    """The workflow run was cancelled (raised by `wait_workflow`)."""

    def __init__(self, run_id: int) -> None:
        super().__init__(f"workflow run {run_id} was cancelled")
        self.run_id = run_id


class WorkflowFailed(TreadleError):
    """The workflow run failed: `step`'s job was discarded, and `error` is its last error."""

    def __init__(self, run_id: int, step: str | None, error: str | None) -> None:
        super().__init__(f"workflow run {run_id} failed at step {step!r}: {error}")
        self.run_id = run_id
        self.step = step
        self.error = error


class WorkflowNotFound(TreadleError, LookupError):
    """No workflow run has that id."""

    def __init__(self, run_id: int) -> None:
        super().__init__(f"no workflow run with id {run_id}")
        self.run_id = run_id


ARGUMENT_SQLSTATES = frozenset({"22023", "22004"})
QUEUE_FULL_SQLSTATE = "TQ001"


def translate(error: BaseException) -> BaseException:
    """The treadle exception for a database error, or the error itself."""
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate not in ARGUMENT_SQLSTATES and sqlstate != QUEUE_FULL_SQLSTATE:
        return error
    diag: Any = getattr(error, "diag", None)
    message = (diag.message_primary if diag is not None else None) or str(error)
    if sqlstate == QUEUE_FULL_SQLSTATE:
        return QueueFull(message, sqlstate)
    return InvalidArgument(message, sqlstate)


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raise the SQL layer's argument errors as `InvalidArgument`, a full queue as `QueueFull`."""
    try:
        yield
    except psycopg.Error as error:
        mapped = translate(error)
        if mapped is error:
            raise
        raise mapped from error
