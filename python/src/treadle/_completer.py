"""Writing what became of a job: completions (buffered, many per statement), failures and hand-backs.

A worker finishing hundreds of short jobs a second would otherwise spend a round
trip and a commit on each, so successes wait a few milliseconds and finish
together with `treadle.complete_many`.

Each write names the job's lease token. A null answer means the token no longer
holds the job: that is reported as a lost lease and never retried. A write that
cannot reach the database, or whose answer was lost on the way back, is repeated
with the same arguments on a fresh connection until `abandon` is set (the worker
is stopping); finishing is idempotent per token, so a repeat of a write that
committed answers the state it left. A write given up on leaves the job's lease
to lapse; a rescue then returns it.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from . import _sql
from ._literals import Fixed, bigint_array, text_array, uuid_array
from ._pool import WorkerPool
from ._retry import Backoff, FailureWrite, is_transient, message_of, one_line
from ._run_state import RunState
from .errors import Snooze
from .logs import logfmt

if TYPE_CHECKING:
    from typing_extensions import LiteralString

    from ._events import EventKind

log = logging.getLogger("treadle.worker")

T = TypeVar("T")

# The SQL keeps at most this much of an error, its head and its tail; trimming here first
# keeps a deep traceback from crossing the wire whole.
MAX_ERROR_CHARS = 16_384
ERROR_KEEP = 8_000  # characters kept from each end of a longer error


class Unwritten:
    """A write given up on (the database refused it, or the worker is stopping)."""


UNWRITTEN = Unwritten()


class CompleterHost(Protocol):
    """What the completer needs from the worker."""

    def emit(self, kind: EventKind, run: RunState, *, state: str | None = None, error: str | None = None) -> None:
        """Report what became of a job (WorkerEvent)."""
        ...

    def done(self, run: RunState) -> None:
        """The job is settled (or given up on): the worker stops answering for it."""
        ...

    def failure_write(self, run: RunState, error: BaseException) -> FailureWrite:
        """How to record the failed attempt: retry it (after how long) or not (the handler's policy)."""
        ...

    def idle(self) -> bool:
        """No handler is running, so no success is on its way: write the ones buffered at once."""
        ...


class ClaimAlong(Protocol):
    """What the producer (_producer.py) lends the completer so that each write of successes claims more work too."""

    def reserve(self) -> int:
        """How many jobs to claim with this write; held for it until `adopt` or `release`."""
        ...

    @property
    def cycle_statement(self) -> Fixed:
        """_sql.COMPLETE_AND_CLAIM with the claim's fixed arguments (worker_id, queues, names, lease)."""
        ...

    def params(self, batch: int, lease_token: uuid.UUID) -> dict[str, Any]:
        """The claim's arguments that `cycle_statement` still takes (batch, lease_token)."""
        ...

    def adopt(self, rows: list[tuple[Any, ...]], asked: int, *, inline: bool = False) -> list[Any]:
        """Run the jobs claimed (`asked` were asked for): rows of _sql.CLAIMED_NAMES.

        The reservation of `asked` slots ends here, once the jobs hold their slots. With
        `inline`, the jobs this thread may run itself (quick handlers) are returned for
        `run_in_turn`, not handed to a handler thread.
        """
        ...

    def run_in_turn(self, calls: list[Any]) -> None:
        """Run the jobs `adopt` returned on this thread (the completer's writer)."""
        ...

    def recover(self, lease_token: uuid.UUID) -> None:
        """The answer was lost: run what a claim under `lease_token` committed, if it did."""
        ...

    def release(self, reserved: int) -> None:
        """A reservation that no jobs took (the claim failed, or was not made) ends."""
        ...


class Completion(NamedTuple):
    run: RunState
    result: Jsonb | None


class Completer:
    """The worker's writes after a handler returned or raised."""

    def __init__(
        self,
        pool: WorkerPool,
        worker_id: str,
        host: CompleterHost,
        *,
        delay: float,
        flush_at: int | None = None,
        claim_along: ClaimAlong | None = None,
        writers: int | None = None,
    ) -> None:
        self._pool = pool
        self._claim_along = claim_along
        self._worker_id = worker_id
        self._host = host
        self.abandon = threading.Event()
        # no handler still running means no success is on its way: write at once
        self._buffer = CompletionBuffer(
            self._complete_batch,
            delay=delay,
            idle=host.idle,
            flush_at=flush_at,
            writers=writers,
            name=f"treadle-completer-{worker_id}",
        )

    def complete(self, run: RunState, result: Jsonb | None) -> None:
        """Queue a success; RuntimeError once the completer is closed."""
        self._buffer.add(Completion(run, result))

    def close(self, timeout: float) -> None:
        self._buffer.close(timeout=timeout)

    def hand_off(self, writer: int) -> None:
        """The writer thread `writer` runs a handler that turned out slow: another thread writes now."""
        self._buffer.hand_off(writer)

    def pending(self) -> int:
        """Successes queued or being written."""
        return self._buffer.pending()

    def fail(self, run: RunState, error: BaseException) -> None:
        """Record a failed attempt: retryable (after the backoff), discarded, or cancelled; or a snooze."""
        if isinstance(error, Snooze):
            self._snooze(run, error.delay)
            return
        message = one_line(error)
        write = self._host.failure_write(run, error)
        state = self.retrying(
            _sql.FAIL,
            {
                "job_id": run.job_id,
                "lease_token": run.lease_token,
                "error": describe(error),
                "retry_in": write.retry_in,
                "retryable": write.retryable,
                "queue": run.queue,
            },
            f"record the failure of job {run.job_id}",
        )
        if state is None:
            run.mark_lost()
        elif state == "cancelled":
            log.info("job %d (%s) cancelled", run.job_id, run.name)
            self._host.emit("cancelled", run, state=state, error=message)
        elif not isinstance(state, Unwritten):
            self._log_failure(run, state, error)
            self._host.emit("failed", run, state=state, error=message)
        self._host.done(run)

    def _snooze(self, run: RunState, delay: timedelta) -> None:
        """The handler raised Snooze: the job runs again after `delay`, its attempt given back."""
        state = self.retrying(
            _sql.SNOOZE,
            {"job_id": run.job_id, "lease_token": run.lease_token, "delay": delay, "queue": run.queue},
            f"snooze job {run.job_id}",
        )
        if state is None:
            run.mark_lost()
        elif state == "cancelled":
            log.info("job %d (%s) cancelled", run.job_id, run.name)
            self._host.emit("cancelled", run, state=state)
        elif not isinstance(state, Unwritten):
            log.info("job %d (%s) snoozed for %g s", run.job_id, run.name, delay.total_seconds())
            self._host.emit("snoozed", run, state=state)
        self._host.done(run)

    def _log_failure(self, run: RunState, state: str, error: BaseException) -> None:
        """One line per failed attempt, its fields as key=value pairs (and as record attributes: logs.py)."""
        lines = message_of(error).strip().splitlines()
        fields = {
            "job_id": run.job_id,
            "job_name": run.name,
            "queue": run.queue,
            "attempt": run.attempt,
            "max_attempts": run.max_attempts,
            "state": state,
            "error_type": type(error).__name__,
            "error": lines[0] if lines else None,
            "worker_id": self._worker_id,
        }
        log.warning("job failed %s", logfmt(fields), extra=fields)

    def release(self, run: RunState) -> None:
        """Hand a job back at shutdown: available again, its attempt given back."""
        state = self.retrying(
            _sql.RELEASE,
            {"job_id": run.job_id, "lease_token": run.lease_token, "queue": run.queue},
            f"hand back job {run.job_id}",
        )
        if not isinstance(state, Unwritten):
            log.info("job %d (%s) handed back: %s", run.job_id, run.name, state or "its lease was already lost")
            self._host.emit("released", run, state=state)

    def retrying(self, query: LiteralString, params: dict[str, Any], what: str, *, rows: bool = False) -> Any:
        """Run a statement, repeating it while the database is unreachable; UNWRITTEN when given up."""
        backoff = Backoff()
        while True:
            try:
                return self._pool.rows(query, params) if rows else self._pool.value(query, params)
            except psycopg.Error as error:
                if not is_transient(error):
                    log.error("worker %s: could not %s: %s", self._worker_id, what, one_line(error))
                    return UNWRITTEN
                if self.abandon.is_set():
                    log.warning(
                        "worker %s: could not %s (%s); the lease will lapse and a rescue returns the job",
                        self._worker_id,
                        what,
                        one_line(error),
                    )
                    return UNWRITTEN
                delay = backoff.next()
                log.warning(
                    "worker %s: could not %s (%s); trying again in %.1f s",
                    self._worker_id,
                    what,
                    one_line(error),
                    delay,
                )
                self.abandon.wait(delay)

    def _complete_batch(self, batch: list[Completion]) -> Callable[[], None] | None:
        """Finish buffered successes in one statement (and claim more with them, when lent a ClaimAlong).

        The jobs claimed with them whose handlers are quick then run on this thread, one
        after another, once the successes are recorded: a hand-off to a handler thread and
        back costs more than such a handler (Executor.run_in_turn). They are returned as
        the write's sequel, which the buffer runs once the write no longer counts as
        pending: a slow one among them is no success on its way, which would keep the
        claim loop from claiming for the slots that free meanwhile.
        """
        inline: list[Any] = []
        try:
            results = [c.result for c in batch]
            runs = [c.run for c in batch]
            # arrays as literals: psycopg dumps a list element by element (_literals.py)
            params = {
                "job_ids": bigint_array([run.job_id for run in runs]),
                "lease_tokens": uuid_array([run.lease_token for run in runs]),
                "job_queues": text_array([run.queue for run in runs]),
                # no array of nulls to send when no handler returned anything (most batches)
                "results": None if all(r is None for r in results) else results,
            }
            rows = self._write_successes(params, len(batch), inline)
            for index, completion in enumerate(batch):
                if isinstance(rows, Unwritten):
                    self._complete_one(completion)
                else:
                    self._completed(completion.run, rows[index]["state"])
        except Exception:
            # a fault of the worker itself: free the slots; the leases lapse and a rescue returns the jobs
            log.exception("worker %s: completing %d jobs failed", self._worker_id, len(batch))
            for completion in batch:
                self._host.done(completion.run)
        if not inline:
            return None
        claim_along = self._claim_along
        assert claim_along is not None
        return lambda: claim_along.run_in_turn(inline)

    def _write_successes(
        self, params: dict[str, Any], count: int, inline: list[Any]
    ) -> list[dict[str, Any]] | Unwritten:
        """One (job_id, state) row per success, or UNWRITTEN; the claimed jobs to run here go on `inline`.

        With a ClaimAlong, one treadle.complete_and_claim finishes them and claims. When
        it fails, the claim is read back by its token if its answer may have been lost,
        and the successes go through complete_many, which a repeat leaves as the first
        call did (and which, refused, falls back to one job at a time).
        """
        what = f"complete {count} jobs"
        claim = self._claim_along
        if claim is None:
            result: list[dict[str, Any]] | Unwritten = self.retrying(_sql.COMPLETE_MANY, params, what, rows=True)
            return result
        reserved = claim.reserve()
        token = uuid.uuid4()
        adopted = False  # (adopt ends the reservation itself, once the jobs claimed hold their slots)
        try:
            try:
                answer = self._pool.tuples(claim.cycle_statement, {**params, **claim.params(reserved, token)})
            except psycopg.Error as error:
                if is_transient(error):
                    log.warning("worker %s: could not %s and claim (%s)", self._worker_id, what, one_line(error))
                    if reserved:
                        claim.recover(token)
                fallback: list[dict[str, Any]] | Unwritten = self.retrying(_sql.COMPLETE_MANY, params, what, rows=True)
                return fallback
            if reserved:
                adopted = True
                inline.extend(claim.adopt([row[2:] for row in answer[count:]], reserved, inline=True))
            return [{"state": row[1]} for row in answer[:count]]
        finally:
            if not adopted:
                claim.release(reserved)

    def _complete_one(self, completion: Completion) -> None:
        """After complete_many failed for good: each job alone, so one bad row does not hold the rest."""
        run = completion.run
        if self.abandon.is_set():
            self._host.done(run)
            return
        state = self.retrying(
            _sql.COMPLETE,
            {"job_id": run.job_id, "lease_token": run.lease_token, "result": completion.result, "queue": run.queue},
            f"complete job {run.job_id}",
        )
        if isinstance(state, Unwritten) and not self.abandon.is_set():
            # the database refused this result: that is the attempt's failure
            self.fail(run, ValueError("the database refused to store the handler's result"))
            return
        self._completed(run, state)

    def _completed(self, run: RunState, state: Any) -> None:
        if state is None:
            run.mark_lost()
        elif not isinstance(state, Unwritten):
            self._host.emit("cancelled" if state == "cancelled" else "completed", run, state=state)
        self._host.done(run)


def describe(error: BaseException) -> str:
    """The error stored on the job: the exception and its traceback, its head and tail when long.

    The exception's own line is the last one, so the tail is kept whole; text
    columns take no NUL.
    """
    try:
        text = "".join(traceback.format_exception(error)).strip()
    except BaseException:  # a traceback that cannot even be formatted still fails its job
        text = f"{type(error).__name__} (its traceback could not be formatted)"
    text = text.replace("\x00", "\\0")
    if len(text) <= MAX_ERROR_CHARS:
        return text
    cut = len(text) - 2 * ERROR_KEEP
    return f"{text[:ERROR_KEEP]}\n... [{cut} characters of the traceback cut] ...\n{text[-ERROR_KEEP:]}"


class CompletionBuffer(Generic[T]):
    """Collects items and hands them to `write` in batches, from a thread of its own.

    A batch is written `delay` seconds after its first item arrived, or at once when
    it holds `flush_at` items (`max_batch` unless given), when `idle()` says no more
    items are on their way (waiting would only delay these), or when the buffer is
    closing. While a write is out, items gather for the next one. `write` must
    deal with its own failures: an exception it raises is logged and its batch is
    dropped. `idle` is called with the buffer's lock held: it must not call back
    into the buffer.

    `write` may return a sequel that the writer thread runs once the batch no longer
    counts as pending: the worker's quick handlers claimed with the write
    (_executor.Executor.run_in_turn); when one of them turns out slow, `hand_off`
    has another thread write, so that a slow handler never holds the other jobs'
    writes. The old writer, once its sequel returns, waits as a spare that the next
    hand_off takes: a handler's per-thread state (a threading.local connection) is
    made once per thread the buffer keeps, not once per hand-off. At most `writers`
    threads write or wait as spares (unbounded when None); with that many, a hand_off
    finding no spare is refused, and the writes wait for the held writer.
    """

    def __init__(
        self,
        write: Callable[[list[T]], Callable[[], None] | None],
        *,
        delay: float = 0.005,
        max_batch: int = 500,
        flush_at: int | None = None,
        idle: Callable[[], bool] | None = None,
        name: str = "treadle-completer",
        writers: int | None = None,
    ) -> None:
        if delay < 0:
            raise ValueError(f"delay must not be negative, got {delay}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if flush_at is not None and not 1 <= flush_at <= max_batch:
            raise ValueError(f"flush_at must be between 1 and max_batch ({max_batch}), got {flush_at}")
        if writers is not None and writers < 1:
            raise ValueError(f"writers must be at least 1, got {writers}")
        self._write = write
        self._flush_at = max_batch if flush_at is None else flush_at
        self._delay = delay
        self._max_batch = max_batch
        self._idle = idle
        self._items: list[T] = []
        self._writing = 0  # items taken from the buffer whose write has not returned
        self._cond = threading.Condition()
        self._closing = False
        self._name = name
        self._max_writers = writers
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)  # the writer
        self._busy = False  # the writer has taken a batch and its write or sequel has not returned
        self._spares: list[threading.Thread] = []  # writers handed off from, whose sequel returned
        self._writers = {self._thread}  # every writer thread not yet ended
        self._thread.start()

    def add(self, item: T) -> None:
        with self._cond:
            if self._closing:
                raise RuntimeError("the completion buffer is closed")
            self._items.append(item)
            # wake the writer only when it has something to decide: each wake-up costs a
            # thread switch, and the writer waits for the GIL behind the handlers
            count = len(self._items)
            if count == 1 or count >= self._flush_at or (self._idle is not None and self._idle()):
                self._cond.notify_all()

    def pending(self) -> int:
        """Items added whose write has not finished."""
        with self._cond:
            return len(self._items) + self._writing

    def hand_off(self, writer: int) -> bool:
        """The writer thread `writer` (an ident) is held up in a write or its sequel (a slow handler
        it runs): a spare, or else a new thread, writes from now on; the old one becomes a spare
        once its sequel returns. False when `writer` is no longer the writer or is back waiting
        for items (nothing holds it), when the buffer is closing, or when `writers` threads are
        kept and none is spare."""
        with self._cond:
            if self._closing or self._thread.ident != writer or not self._busy:
                return False
            if self._spares:
                self._thread = self._spares.pop()
            elif self._max_writers is not None and len(self._writers) >= self._max_writers:
                return False
            else:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._writers.add(self._thread)
                self._thread.start()
            self._busy = False
            self._cond.notify_all()  # (wakes the spare taken)
            return True

    def threads(self) -> int:
        """Writer threads not yet ended: the writer, those held up, the spares."""
        with self._cond:
            return len(self._writers)

    def close(self, timeout: float | None = None) -> bool:
        """Write what is buffered now, then stop. True when everything was written in time,
        the writes of writers handed off from included (one may still be in its write or
        sequel: it ends when that returns). The spares end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
            spares = list(self._spares)
        thread.join(timeout)
        with self._cond:
            while self._writing:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
            written = self._writing == 0
        for spare in spares:
            spare.join(None if deadline is None else max(deadline - time.monotonic(), 0))
        return written and not thread.is_alive()

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            self._serve(me)
        finally:
            with self._cond:
                self._writers.discard(me)
                if me in self._spares:
                    self._spares.remove(me)

    def _serve(self, me: threading.Thread) -> None:
        while True:
            with self._cond:
                if self._thread is me:
                    self._busy = False
                while self._thread is not me and not self._closing:
                    if me not in self._spares:
                        self._spares.append(me)  # handed off from: wait until a hand_off takes it
                    self._cond.wait()
                if self._thread is not me:
                    return  # a spare, and the buffer is closing
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items:
                    return  # closing, and nothing left
                deadline = time.monotonic() + self._delay
                while len(self._items) < self._flush_at and not self._closing:
                    if self._idle is not None and self._idle():
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch = self._items[: self._max_batch]
                del self._items[: self._max_batch]
                self._writing += len(batch)  # (a writer handed off from may still be writing)
                self._busy = True
            sequel: Callable[[], None] | None = None
            try:
                sequel = self._write(batch)
            except Exception:
                log.exception("writing %d buffered completions failed", len(batch))
            finally:
                with self._cond:
                    self._writing -= len(batch)
                    if sequel is None and self._thread is me:
                        self._busy = False  # (as soon as it no longer counts as pending)
                    self._cond.notify_all()
            if sequel is not None:
                try:
                    sequel()
                except Exception:
                    log.exception("after writing %d buffered completions", len(batch))
