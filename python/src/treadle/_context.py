"""JobContext: what a handler knows about the job it runs, and what it may do with it."""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping
from datetime import datetime, timedelta
from numbers import Real
from types import MappingProxyType
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row

from . import _args, _sql
from ._json import to_jsonb
from ._pool import WorkerPool
from ._run_state import HeartbeatAnswer, RunState, RunStatus
from .errors import MAX_SNOOZE, InvalidArgument, JobCancelled, JobTimeout, LeaseLost, Snooze, TreadleError
from .models import JobFields

NO_RESULTS: Mapping[str, Any] = MappingProxyType({})


def _in_transaction_block(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    # psycopg keeps no public flag for "inside `with conn.transaction()`"; inside one,
    # an explicit commit is refused, and the block itself commits or rolls back.
    # Checked against psycopg 3.2: tests/worker/test_worker_context.py pins both cases.
    return bool(getattr(conn, "_num_transactions", 0))


class JobContext(JobFields):
    """Handed to every handler and workflow step with the job it runs.

    `cancelled` is set when the job is cancelled, when its lease is lost (another
    worker or a rescue took it over: nothing this run returns will be written),
    when the attempt runs past its timeout (`timed_out`; the attempt fails with
    `JobTimeout` whatever the handler returns) and when the worker hands it back at
    shutdown. Long handlers should look at it, or call `check_cancelled()`, between
    units of work.
    """

    def __init__(self, state: RunState, worker_id: str, pool: WorkerPool, lease: float | timedelta) -> None:
        self.job = state.job
        self.worker_id = worker_id
        self._state = state
        self._pool = pool
        self._lease = lease if isinstance(lease, timedelta) else timedelta(seconds=lease)
        self._results: Mapping[str, Any] = NO_RESULTS
        self._sleeps = 0  # ctx.sleep calls made in this attempt

    # what the job is: job_id, name, queue, args, attempt, max_attempts, run_id, step (JobFields)
    @property
    def cancelled(self) -> threading.Event:
        """Set when the handler should stop (the class's docstring says when); made on first use."""
        return self._state.cancelled

    @property
    def lease_token(self) -> UUID:
        """The token that fences this run's writes (treadle.complete and friends take it)."""
        return self._state.lease_token

    @property
    def results(self) -> Mapping[str, Any]:
        """A workflow step's earlier results, keyed by step name (read-only).

        Those of the steps it runs after, directly or through others (for a list, every
        step before it); empty for the first steps, and for a plain job.
        """
        return self._results

    def _set_results(self, results: dict[str, Any]) -> None:
        """Set by the worker before a step runs."""
        self._results = MappingProxyType(results)

    @property
    def lease_lost(self) -> bool:
        return self._state.lost

    @property
    def cancel_requested(self) -> bool:
        return self._state.cancel_requested

    @property
    def timed_out(self) -> bool:
        """The attempt ran past its timeout (the job's, or the handler's)."""
        return self._state.timed_out_after is not None

    def __repr__(self) -> str:
        return f"<JobContext job {self.job_id} {self.name!r} attempt {self.attempt} {self._state.status.value}>"

    # what the handler may do
    def check_cancelled(self) -> None:
        """Raise why the handler should stop, if it should.

        LeaseLost if the lease is gone, JobTimeout if the attempt ran past its
        timeout, JobCancelled if the job was cancelled or handed back.
        """
        if self._state.lost:
            raise LeaseLost(f"job {self.job_id}: the lease was lost; another worker or a rescue took it over")
        timed_out_after = self._state.timed_out_after
        if timed_out_after is not None:
            raise JobTimeout(self.job_id, timed_out_after)
        if self.cancelled.is_set():
            if self._state.status is RunStatus.RELEASED:
                raise JobCancelled(self.job_id, f"job {self.job_id} was handed back: the worker is stopping")
            raise JobCancelled(self.job_id)

    def heartbeat(self) -> str:
        """Extend the lease now; returns 'held', 'cancel' or 'lost' and sets `cancelled` for the last two."""
        answer = self._pool.value(
            _sql.HEARTBEAT,
            {"job_id": self.job_id, "lease_token": self.lease_token, "lease": self._lease, "queue": self.queue},
        )
        parsed = HeartbeatAnswer(answer) if answer is not None else HeartbeatAnswer.LOST
        self._state.apply_heartbeat(parsed)
        return parsed.value

    def progress(self, fraction: float, message: str | None = None) -> bool:
        """Record how far the job has come (0..1, and a note) for the views.

        Returns False, and sets `cancelled`, when the lease no longer holds the job.
        """
        given: object = fraction  # a handler may pass anything: refuse what is not a number
        if isinstance(given, bool) or not isinstance(given, Real):
            raise InvalidArgument(f"fraction must be a number between 0 and 1, not {type(fraction).__name__}")
        if not (math.isfinite(fraction) and 0 <= fraction <= 1):
            raise InvalidArgument(f"fraction must be between 0 and 1, got {fraction!r}")
        message = _args.optional_text(message, "message")
        held = bool(
            self._pool.value(
                _sql.PROGRESS,
                {
                    "job_id": self.job_id,
                    "lease_token": self.lease_token,
                    "fraction": float(fraction),
                    "message": message,
                    "queue": self.queue,
                },
            )
        )
        if not held:
            self._state.mark_lost(only_while_running=True)
        return held

    def sleep(self, delay: float | timedelta | None = None, *, until: datetime | None = None) -> None:
        """A workflow step waits `delay` (seconds or a timedelta) or `until` a time, durably.

        The first time the step reaches this call, the wake time (on treadle's clock) is
        recorded on its run, and the attempt ends: the job is snoozed until then
        (treadle.snooze: no worker, connection or attempt is held meanwhile), and
        `Snooze` is raised here: let it propagate. The step then runs again from the
        start; this call, reached again, returns at once once its wake time has passed
        (a retry or a rescue of the step finds it too). Calls are told apart by their
        order in the step: make the same calls in the same order on every run. At most
        100 a step, each at most 366 days. LeaseLost when the lease is gone.
        """
        if (delay is None) == (until is None):
            raise InvalidArgument("ctx.sleep takes a delay or until=, one of them")
        if self.run_id is None:
            raise InvalidArgument("ctx.sleep is for workflow steps; a job waits with `raise treadle.Snooze(delay)`")
        wait: timedelta | None = None
        if delay is not None:
            wait = timedelta(seconds=_args.seconds(delay, "delay", allow_zero=True))
            if wait > MAX_SNOOZE:
                raise InvalidArgument(f"delay must be at most {MAX_SNOOZE.days} days, got {wait}")
        if until is not None and not (isinstance(until, datetime) and until.tzinfo is not None):
            raise InvalidArgument(f"until must be a timezone-aware datetime, not {until!r}")
        seq = self._sleeps
        self._sleeps += 1
        left = self._pool.value(
            _sql.STEP_SLEEP,
            {"job_id": self.job_id, "lease_token": self.lease_token, "seq": seq, "delay": wait, "until": until},
        )
        if left is None:
            self._state.mark_lost(only_while_running=True)
            raise LeaseLost(f"job {self.job_id}: the lease was lost; another worker or a rescue took it over")
        if left > timedelta(0):
            raise Snooze(left)

    def complete_in(self, conn: psycopg.Connection[Any], result: Any = None) -> str:
        """Complete the job in the transaction that holds the handler's own writes.

        `conn` has autocommit off (psycopg's default) and its open transaction holds
        the handler's writes: both commit together. Called inside a
        `with conn.transaction():` block, the completion joins the block and commits
        with it. When the lease was lost, the handler's writes are rolled back (or the
        block is, as LeaseLost leaves it) and LeaseLost is raised. Returns the job's
        new state ('completed', or 'cancelled' if a cancel was requested). The worker
        then writes nothing more for this job.
        """
        given: object = conn  # a handler may pass anything: say what it should pass
        if isinstance(given, psycopg.AsyncConnection):
            raise InvalidArgument("complete_in takes a sync connection; use `await ctx.complete_in_async(conn)`")
        if not isinstance(given, psycopg.Connection):
            raise InvalidArgument(f"complete_in needs a psycopg Connection, not {type(given).__name__}")
        encoded = to_jsonb(result, "the job's result")
        in_block = self._check_complete_in(conn.autocommit, _in_transaction_block(conn))
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(
                _sql.COMPLETE,
                {"job_id": self.job_id, "lease_token": self.lease_token, "result": encoded, "queue": self.queue},
            )
            row = cur.fetchone()
        state = None if row is None else row[0]
        if state is None:
            if not in_block:
                conn.rollback()
            self._lost_in_complete()
        if not in_block:
            conn.commit()
        self._state.complete(str(state))
        return str(state)

    async def complete_in_async(self, conn: psycopg.AsyncConnection[Any], result: Any = None) -> str:
        """`complete_in` for an async connection (in an `async def` handler)."""
        if not isinstance(conn, psycopg.AsyncConnection):
            raise InvalidArgument(f"complete_in_async needs a psycopg AsyncConnection, not {type(conn).__name__}")
        encoded = to_jsonb(result, "the job's result")
        in_block = self._check_complete_in(conn.autocommit, _in_transaction_block(conn))
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(
                _sql.COMPLETE,
                {"job_id": self.job_id, "lease_token": self.lease_token, "result": encoded, "queue": self.queue},
            )
            row = await cur.fetchone()
        state = None if row is None else row[0]
        if state is None:
            if not in_block:
                await conn.rollback()
            self._lost_in_complete()
        if not in_block:
            await conn.commit()
        self._state.complete(str(state))
        return str(state)

    async def acomplete_in(self, conn: psycopg.AsyncConnection[Any], result: Any = None) -> str:
        """Deprecated name of `complete_in_async`."""
        warnings.warn("ctx.acomplete_in is renamed ctx.complete_in_async", DeprecationWarning, stacklevel=2)
        return await self.complete_in_async(conn, result)

    def _check_complete_in(self, autocommit: bool, in_block: bool) -> bool:
        if autocommit and not in_block:
            raise InvalidArgument(
                "complete_in needs the handler's writes in an open transaction: use a connection "
                "with autocommit off, or call it inside `with conn.transaction():`"
            )
        if self._state.status is RunStatus.COMPLETED:
            raise TreadleError(f"job {self.job_id} was already completed with complete_in")
        return in_block

    def _lost_in_complete(self) -> None:
        self._state.mark_lost()
        raise LeaseLost(f"job {self.job_id}: the lease was lost before complete_in; its writes were rolled back")
