"""Writing what became of a job: completions (in batches), failures and hand-backs.

Each write names the job's lease token. A null answer means the token no longer
holds the job: that is reported as a lost lease and never retried. A write that
cannot reach the database is retried with backoff until `abandon` is set (the
worker is stopping); the job's lease then lapses and a rescue returns it.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple, Protocol

import psycopg
from psycopg.types.json import Jsonb

from treadle import _sql
from treadle._context import JobContext
from treadle._db import Backoff, Database, is_transient, one_line
from treadle._events import EventKind

log = logging.getLogger("treadle.worker")

UNWRITTEN = object()  # a write given up on


class Emit(Protocol):
    def __call__(self, kind: EventKind, ctx: JobContext, *, state: str | None = None,
                 error: str | None = None) -> None: ...


class Completion(NamedTuple):
    ctx: JobContext
    result: Jsonb | None


class Outcomes:
    """The worker's writes after a handler returned or raised."""

    def __init__(self, db: Database, worker_id: str, *, emit: Emit, done: Callable[[JobContext], None],
                 retry_in: Callable[[int], timedelta | None]) -> None:
        self._db = db
        self._worker_id = worker_id
        self._emit = emit
        self._done = done
        self._retry_in = retry_in
        self.abandon = threading.Event()

    def complete_batch(self, batch: list[Completion]) -> None:
        """Finish buffered successes with one treadle.complete_many."""
        try:
            self._complete_batch(batch)
        except Exception:
            # a fault of the worker itself: free the slots; the leases lapse and a rescue returns the jobs
            log.exception("worker %s: completing %d jobs failed", self._worker_id, len(batch))
            for completion in batch:
                self._done(completion.ctx)

    def _complete_batch(self, batch: list[Completion]) -> None:
        params = {"job_ids": [c.ctx.job_id for c in batch], "lease_tokens": [c.ctx.lease_token for c in batch],
                  "results": [c.result for c in batch]}
        rows = self.retrying(_sql.COMPLETE_MANY, params, f"complete {len(batch)} jobs", rows=True)
        for index, completion in enumerate(batch):
            if rows is UNWRITTEN:
                self._complete_one(completion)
            else:
                self._completed(completion.ctx, rows[index]["state"])

    def fail(self, ctx: JobContext, error: BaseException) -> None:
        """Record a failed attempt: retryable (after the backoff), discarded, or cancelled."""
        message = one_line(error)
        state = self.retrying(_sql.FAIL, {
            "job_id": ctx.job_id, "lease_token": ctx.lease_token, "error": describe(error),
            "retry_in": self._retry_in(ctx.attempt)}, f"record the failure of job {ctx.job_id}")
        if state is None:
            ctx._mark_lost()
        elif state == "cancelled":
            log.info("job %d (%s) cancelled", ctx.job_id, ctx.name)
            self._emit("cancelled", ctx, state=state, error=message)
        elif state is not UNWRITTEN:
            log.warning("job %d (%s) attempt %d of %d failed, now %s: %s", ctx.job_id, ctx.name, ctx.attempt,
                        ctx.max_attempts, state, message)
            self._emit("failed", ctx, state=state, error=message)
        self._done(ctx)

    def release(self, ctx: JobContext) -> None:
        """Hand a job back at shutdown: available again, its attempt given back."""
        state = self.retrying(_sql.RELEASE, {"job_id": ctx.job_id, "lease_token": ctx.lease_token},
                              f"hand back job {ctx.job_id}")
        if state is not UNWRITTEN:
            log.info("job %d (%s) handed back: %s", ctx.job_id, ctx.name, state or "its lease was already lost")
            self._emit("released", ctx, state=state)

    def retrying(self, query: str, params: dict[str, Any], what: str, *, rows: bool = False) -> Any:
        """Run a statement, retrying while the database is unreachable; UNWRITTEN when given up."""
        backoff = Backoff()
        while True:
            try:
                return self._db.rows(query, params) if rows else self._db.value(query, params)
            except psycopg.Error as error:
                if not is_transient(error):
                    log.error("worker %s: could not %s: %s", self._worker_id, what, one_line(error))
                    return UNWRITTEN
                if self.abandon.is_set():
                    log.warning("worker %s: could not %s (%s); the lease will lapse and a rescue returns the job",
                                self._worker_id, what, one_line(error))
                    return UNWRITTEN
                delay = backoff.next()
                log.warning("worker %s: could not %s (%s); retrying in %.1f s",
                            self._worker_id, what, one_line(error), delay)
                self.abandon.wait(delay)

    def _complete_one(self, completion: Completion) -> None:
        """After complete_many failed for good: each job alone, so one bad row does not hold the rest."""
        ctx = completion.ctx
        if self.abandon.is_set():
            self._done(ctx)
            return
        state = self.retrying(_sql.COMPLETE, {"job_id": ctx.job_id, "lease_token": ctx.lease_token,
                                              "result": completion.result}, f"complete job {ctx.job_id}")
        if state is UNWRITTEN and not self.abandon.is_set():
            # the database refused this result: that is the attempt's failure
            self.fail(ctx, ValueError("the database refused to store the handler's result"))
            return
        self._completed(ctx, state)

    def _completed(self, ctx: JobContext, state: Any) -> None:
        if state is None:
            ctx._mark_lost()
        elif state is not UNWRITTEN:
            self._emit("cancelled" if state == "cancelled" else "completed", ctx, state=state)
        self._done(ctx)


def describe(error: BaseException) -> str:
    """The error stored on the job: the exception and its traceback (text columns take no NUL)."""
    return "".join(traceback.format_exception(error)).strip().replace("\x00", "\\0")
