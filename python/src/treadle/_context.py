"""JobContext: what a handler knows about the job it runs, and what it may do with it."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from numbers import Real
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row

from treadle import _args, _sql
from treadle._db import Database
from treadle._json import to_jsonb
from treadle.errors import InvalidArgument, JobCancelled, LeaseLost, TreadleError
from treadle.models import Job, JobFields

# A context's life in the worker. Only one of the ways out of "running" wins.
RUNNING = "running"      # the handler works
FINISHING = "finishing"  # the handler is done; the worker writes its outcome
COMPLETED = "completed"  # the handler completed the job itself (complete_in)
RELEASED = "released"    # handed back at shutdown; nothing more is written


def _in_transaction_block(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    # psycopg keeps no public flag for "inside `with conn.transaction()`"; inside one,
    # an explicit commit is refused, and the block itself commits or rolls back.
    return bool(getattr(conn, "_num_transactions", 0))


class JobContext(JobFields):
    """Handed to every handler and workflow step with the job it runs.

    `cancelled` is set when the job is cancelled, when its lease is lost (another
    worker or a rescue took it over: nothing this run returns will be written) and
    when the worker hands it back at shutdown. Long handlers should look at it, or
    call `check_cancelled()`, between units of work.
    """

    def __init__(self, job: Job, worker_id: str, db: Database, lease: float,
                 on_lost: Callable[[JobContext], None] | None = None) -> None:
        self.job = job
        self.worker_id = worker_id
        self.cancelled = threading.Event()
        self._db = db
        self._lease = timedelta(seconds=lease)
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._status = RUNNING
        self._lost = False
        self._cancel_requested = False
        self._hooks: list[Callable[[], object]] = []
        self._completed_state: str | None = None
        self._last_beat = time.monotonic()

    # what the job is: job_id, name, queue, args, attempt, max_attempts, run_id, step (JobFields)
    @property
    def lease_token(self) -> UUID:
        """The token that fences this run's writes (treadle.complete and friends take it)."""
        token = self.job.lease_token
        assert token is not None, "a claimed job always has a lease token"
        return token if isinstance(token, UUID) else UUID(str(token))

    @property
    def lease_lost(self) -> bool:
        return self._lost

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested

    def __repr__(self) -> str:
        return f"<JobContext job {self.job_id} {self.name!r} attempt {self.attempt} {self._status}>"

    # what the handler may do
    def check_cancelled(self) -> None:
        """Raise LeaseLost if the lease is gone, JobCancelled if the job was cancelled or handed back."""
        if self._lost:
            raise LeaseLost(f"job {self.job_id}: the lease was lost; another worker or a rescue took it over")
        if self.cancelled.is_set():
            if self._status == RELEASED:
                raise JobCancelled(self.job_id, f"job {self.job_id} was handed back: the worker is stopping")
            raise JobCancelled(self.job_id)

    def heartbeat(self) -> str:
        """Extend the lease now; returns 'held', 'cancel' or 'lost' and sets `cancelled` for the last two."""
        answer = str(self._db.value(_sql.HEARTBEAT, {
            "job_id": self.job_id, "lease_token": self.lease_token, "lease": self._lease}))
        self._apply_heartbeat(answer)
        return answer

    def progress(self, fraction: float, message: str | None = None) -> bool:
        """Record how far the job has come (0..1, and a note) for the views.

        Returns False, and sets `cancelled`, when the lease no longer holds the job.
        """
        if not isinstance(fraction, Real) or isinstance(fraction, bool):
            raise InvalidArgument(f"fraction must be a number between 0 and 1, not {type(fraction).__name__}")
        if not (math.isfinite(fraction) and 0 <= fraction <= 1):
            raise InvalidArgument(f"fraction must be between 0 and 1, got {fraction!r}")
        message = _args.optional_text(message, "message")
        held = bool(self._db.value(_sql.PROGRESS, {
            "job_id": self.job_id, "lease_token": self.lease_token,
            "fraction": float(fraction), "message": message}))
        if not held:
            self._mark_lost(only_while_running=True)
        return held

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
        if isinstance(conn, psycopg.AsyncConnection):
            raise InvalidArgument("complete_in takes a sync connection; use `await ctx.acomplete_in(conn)`")
        if not isinstance(conn, psycopg.Connection):
            raise InvalidArgument(f"complete_in needs a psycopg Connection, not {type(conn).__name__}")
        encoded = to_jsonb(result, "the job's result")
        in_block = self._check_complete_in(conn.autocommit, _in_transaction_block(conn))
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(_sql.COMPLETE, {"job_id": self.job_id, "lease_token": self.lease_token, "result": encoded})
            row = cur.fetchone()
        state = None if row is None else row[0]
        if state is None:
            if not in_block:
                conn.rollback()
            self._lost_in_complete()
        if not in_block:
            conn.commit()
        return self._completed(str(state))

    async def acomplete_in(self, conn: psycopg.AsyncConnection[Any], result: Any = None) -> str:
        """`complete_in` for an async connection (in an `async def` handler)."""
        if not isinstance(conn, psycopg.AsyncConnection):
            raise InvalidArgument(f"acomplete_in needs a psycopg AsyncConnection, not {type(conn).__name__}")
        encoded = to_jsonb(result, "the job's result")
        in_block = self._check_complete_in(conn.autocommit, _in_transaction_block(conn))
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(_sql.COMPLETE, {"job_id": self.job_id, "lease_token": self.lease_token,
                                              "result": encoded})
            row = await cur.fetchone()
        state = None if row is None else row[0]
        if state is None:
            if not in_block:
                await conn.rollback()
            self._lost_in_complete()
        if not in_block:
            await conn.commit()
        return self._completed(str(state))

    def _check_complete_in(self, autocommit: bool, in_block: bool) -> bool:
        if autocommit and not in_block:
            raise InvalidArgument(
                "complete_in needs the handler's writes in an open transaction: use a connection "
                "with autocommit off, or call it inside `with conn.transaction():`")
        with self._lock:
            if self._status == COMPLETED:
                raise TreadleError(f"job {self.job_id} was already completed with complete_in")
        return in_block

    def _lost_in_complete(self) -> None:
        self._mark_lost()
        raise LeaseLost(f"job {self.job_id}: the lease was lost before complete_in; its writes were rolled back")

    def _completed(self, state: str) -> str:
        with self._lock:
            self._status = COMPLETED
            self._completed_state = state
        return state

    # what the worker does with it (not for handlers)
    def _apply_heartbeat(self, answer: str) -> None:
        if answer == "lost":
            # once the handler is done, the token may be gone because its outcome was just written
            self._mark_lost(only_while_running=True)
        else:
            self._last_beat = time.monotonic()
            if answer == "cancel":
                self._cancel_requested = True
                self._fire()

    def _mark_lost(self, *, only_while_running: bool = False) -> bool:
        """Record that the lease is gone; True the first time.

        A job handed back or completed by its handler has no lease to lose.
        """
        with self._lock:
            if self._lost or self._status in (RELEASED, COMPLETED):
                return False
            if only_while_running and self._status != RUNNING:
                return False
            self._lost = True
        self._fire()
        if self._on_lost is not None:
            self._on_lost(self)
        return True

    def _begin_finishing(self) -> str:
        """The handler is done: FINISHING when its outcome is for the worker to write.

        Otherwise the status that already settled the job (COMPLETED, RELEASED), or
        'lost' when the lease is gone.
        """
        with self._lock:
            if self._lost:
                return "lost"
            if self._status == RUNNING:
                self._status = FINISHING
            elif self._status == FINISHING:
                return "lost"  # a second finish of the same run cannot write again
            else:
                return self._status
            return FINISHING

    def _release(self) -> bool:
        """Mark the job handed back at shutdown; False when its handler already finished."""
        with self._lock:
            if self._status != RUNNING or self._lost:
                return False
            self._status = RELEASED
        self._fire()
        return True

    def _add_cancel_hook(self, hook: Callable[[], object]) -> None:
        """Call `hook` when `cancelled` is set (at once if it is already)."""
        with self._lock:
            if not self.cancelled.is_set():
                self._hooks.append(hook)
                return
        hook()

    def _fire(self) -> None:
        with self._lock:
            self.cancelled.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()
