"""Retrying: what a lost connection interrupted (which errors, how long between tries), and a
failed job (whether it may run again, and after how long: the handler's policy).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import NamedTuple

import psycopg

from . import _args
from .errors import Discard
from .models import Job

log = logging.getLogger("treadle.worker")

BackoffFunction = Callable[[int], "float | timedelta"]


def is_transient(error: BaseException) -> bool:
    """True for errors that retrying on a fresh connection can cure.

    OperationalError covers a lost or refused connection, an administrator's
    termination, a pool that timed out, serialization failures and deadlocks.
    """
    return isinstance(error, psycopg.OperationalError)


class Backoff:
    """Delays between retries of a failing operation: `first` seconds, doubling up to `cap`."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self._first = first
        self._cap = cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self._cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self._first


def one_line(error: BaseException) -> str:
    """An exception as one log-friendly line: its type and the first line of its message."""
    lines = message_of(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def message_of(error: BaseException) -> str:
    """str(error), or a fallback that says why not when the exception's __str__ itself raises."""
    try:
        return str(error)
    except BaseException as broken:  # an exception's own __str__ may raise anything
        return f"<its message could not be read: str() raised {type(broken).__name__}>"


class HandlerPolicy(NamedTuple):
    """What `worker.register(..., max_attempts=, backoff=, timeout=)` says about a handler's jobs."""

    max_attempts: int | None = None  # discard once this many attempts failed (the job's own limit also holds)
    backoff: BackoffFunction | None = None  # seconds to wait after failed attempt n
    timeout: float | None = None  # seconds one attempt may run, unless the job has its own


class FailureWrite(NamedTuple):
    """The arguments of treadle.fail beyond the job, its token and its error."""

    retry_in: timedelta | None  # None: the job's own backoff list, or the SQL default, jittered
    retryable: bool


def failure_write(
    error: BaseException, job: Job, policy: HandlerPolicy, worker_backoff: BackoffFunction | None
) -> FailureWrite:
    """How a failed attempt is written.

    Not retryable when the handler raised `Discard` or the handler's max_attempts
    is spent. The delay: a backoff given at enqueue wins (the SQL applies it), then
    the handler's backoff, then the Worker's, then the SQL default.
    """
    retryable = not isinstance(error, Discard) and (policy.max_attempts is None or job.attempt < policy.max_attempts)
    if job.backoff is not None:
        return FailureWrite(None, retryable)
    return FailureWrite(retry_delay(policy.backoff or worker_backoff, job.attempt), retryable)


def retry_delay(backoff: BackoffFunction | None, attempt: int) -> timedelta | None:
    """The user's `backoff(attempt)` as an interval; None (the SQL default) when unset or when it fails."""
    if backoff is None:
        return None
    try:
        return timedelta(seconds=_args.seconds(backoff(attempt), "backoff(attempt)", allow_zero=True))
    except Exception:
        log.exception("backoff(%d) failed; using the default delay", attempt)
        return None


def attempt_timeout(job: Job, policy: HandlerPolicy) -> float | None:
    """Seconds this attempt may run: the job's own timeout, else the handler's; None: no limit."""
    if job.timeout is not None:
        return job.timeout.total_seconds()
    return policy.timeout
