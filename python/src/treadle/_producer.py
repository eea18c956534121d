"""The claim loop: when to claim, how many jobs, and handing what was claimed to the executor.

The Producer owns everything about taking work: the loop that claims with
treadle.claim (a lease token per call; after a lost answer, treadle.claimed says
what it took), the wait between claims (NOTIFY, a freed slot, a rescue or the
poll interval ends it; a rate-limited queue shortens it, claims that found
nothing lengthen it), how many slots a claim may fill (`reserve`, ended by `adopt` or `release`; jobs
held ahead while handlers are quick), the queues' limits (read every few
seconds), and the claims that ride along with a write of successes (it is the
completer's ClaimAlong). What it claims becomes a RunState that the worker
tracks (ProducerHost.track) and the executor runs.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from . import _sql
from ._executor import STEP_NAME, STEP_RUN, Claimed, DeferredLoader, decode_claimed
from ._literals import Fixed, interval, text_array
from ._options import MAX_CONCURRENCY, WorkerOptions
from ._pool import WorkerPool
from ._retry import Backoff, is_transient, one_line
from ._run_state import RunState

if TYPE_CHECKING:
    from ._completer import Completer
    from ._events import EventKind
    from ._executor import Executor

log = logging.getLogger("treadle.worker")

WAIT_SLICE = 0.1  # longest single wait: a stop is noticed within this
# Jobs are claimed ahead of free slots only while handlers take less than this on average
# (a longer handler gains nothing from it, and jobs held ahead would wait behind it).
QUICK_HANDLER = 0.05
# A write of successes runs the jobs it claimed itself, one after another, while handlers take
# less than this on average (Executor.run_in_turn; one that turns out slow is handed on).
INLINE_HANDLER = 0.001
# ... and only as many of them as that average says take this long together: the others go to
# handler threads at once. Handlers that wait (on I/O) run side by side there; one after another
# here they would serialise the worker's `concurrency` and hold the write's successes unwritten.
INLINE_BUDGET = 0.001
# While handlers take less than INLINE_HANDLER on average, a worker left to choose holds this many
# times its claim_ahead: each claim and each write then carries more jobs, for a few milliseconds
# of work held (bench/README.md, "claim_ahead while handlers are quick").
QUICK_AHEAD = 3
HANDLER_TIME_WEIGHT = 0.1  # the weight of the newest run in the handler-time average
EMPTY_CLAIM_GAP = 0.02  # after empty claims that wake-ups started, the next wake-up waits this, doubling
LIMITS_INTERVAL = 5.0  # how often the worker reads its queues' limits (treadle.queue_settings)
RATE_WAIT_FLOOR = 0.05  # the shortest wait between claims on a rate-limited queue


class ProducerHost(Protocol):
    """What the producer needs from the worker: whether it stops, and where claimed jobs go."""

    @property
    def stopping(self) -> bool:
        """A stop was asked for: claim nothing more."""
        ...

    def holding(self) -> int:
        """How many tracked jobs hold a slot (claimed, not yet past their handler)."""
        ...

    def track(self, run: RunState) -> None:
        """A job was claimed: the worker answers for it until it is settled."""
        ...

    def lease_lost(self, run: RunState) -> None:
        """Another worker or a rescue took the job over."""
        ...

    def emit(self, kind: EventKind, run: RunState, *, state: str | None = None, error: str | None = None) -> None:
        """Report what became of a job (WorkerEvent)."""
        ...


def sleep_until_stopped(host: ProducerHost, seconds: float) -> None:
    """Sleep for `seconds`, or until a stop is asked for."""
    deadline = time.monotonic() + seconds
    while not host.stopping and (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(remaining, WAIT_SLICE))


def claim_statements(worker_id: str, queues: list[str], names: list[str], lease: timedelta) -> tuple[Fixed, Fixed]:
    """The worker's claim and finish-and-claim statements (_sql.CLAIM, _sql.COMPLETE_AND_CLAIM), with
    the arguments fixed for its life (its id, queues, job names and lease): written into
    their text on a connection that prepares statements, sent otherwise (_literals.Fixed).
    Either way the server checks them at every call."""
    fixed = {"worker_id": worker_id, "queues": text_array(queues), "names": text_array(names), "lease": interval(lease)}
    return Fixed.of(_sql.CLAIM, fixed), Fixed.of(_sql.COMPLETE_AND_CLAIM, fixed)


class Producer:
    """Claims jobs for a worker, as many as its slots (and `claim_ahead`) allow, and dispatches them.

    `wake` is set by whatever says work may be waiting (NOTIFY, a rescue, a freed
    slot, a stop); `bind` gives it the completer and executor before `run`.
    """

    def __init__(
        self,
        pool: WorkerPool,
        options: WorkerOptions,
        names: list[str],
        host: ProducerHost,
        wake: threading.Event,
    ) -> None:
        self._pool = pool
        self._options = options
        self._names = names
        self._queues = list(options.queues)
        self._lease = timedelta(seconds=options.lease)
        self.claim_statement, self.cycle_statement = claim_statements(
            options.worker_id, self._queues, names, self._lease
        )
        self._host = host
        self._wake = wake
        self._lock = threading.Lock()
        self._completer: Completer | None = None
        self._executor: Executor | None = None
        self._deferred: DeferredLoader | None = None
        self._more_waiting = False  # a freed slot should claim again: the last claim filled every slot, or hit a limit
        self._reserved = 0  # slots a claim under way may fill
        self._handler_time: float | None = None  # average handler run time, seconds
        self._woken_empty = 0  # claims in a row that a wake-up started and that found nothing
        self._after_finish = False  # the wake-up came from a job that left the worker (`settled`)
        self._limited = False  # some queue of this worker has a concurrency or rate limit
        self._rate_wait: float | None = None  # the longest wait between claims, on a rate-limited queue
        self._limits_read_at = -LIMITS_INTERVAL

    def bind(self, completer: Completer, executor: Executor, deferred: DeferredLoader) -> None:
        """The completer whose pending writes claim along, the executor that runs what is claimed,
        and what takes the claimed jobs' deferred fields apart."""
        self._completer = completer
        self._executor = executor
        self._deferred = deferred

    def run(self) -> None:
        """Claim until the host stops."""
        backoff = Backoff()
        woken = False
        while not self._host.stopping:
            self._read_limits()
            after_finish, self._after_finish = self._after_finish, False
            free = self._reserve(for_loop=True)
            if free > 0:
                try:
                    rows = self._claim(free, backoff)
                except BaseException:
                    self.release(free)
                    raise
                if rows is None:
                    self.release(free)
                    continue
                backoff.reset()
                if rows or not woken:
                    self._woken_empty = 0
                elif not after_finish:  # (a claim after a finish is bounded by the jobs that finish)
                    self._woken_empty += 1
                # (the slots stay reserved until the jobs claimed hold them: a write of
                # successes that claims along meanwhile does not count them free)
                self.adopt(rows, free)
            woken = self._wait_for_work()

    # what the worker tells the producer
    def handler_ran(self, seconds: float) -> None:
        """A handler ran for `seconds`: the average decides whether jobs are claimed ahead."""
        average = self._handler_time
        self._handler_time = seconds if average is None else average + HANDLER_TIME_WEIGHT * (seconds - average)

    def slot_freed(self) -> None:
        """A handler is done with its job: claim again if more work was waiting."""
        # successes on their way claim along with their write: no need to wake the loop
        if self._more_waiting and not (self._completer is not None and self._completer.pending()):
            self._wake.set()

    def settled(self) -> None:
        """A job left the worker: claim again at once, unless a write of successes on its way claims along.

        The job may have made work for this worker (a handler that enqueued and then failed,
        or completed its job with complete_in in the transaction of its enqueue; a retry due
        at once): it is found now, not a poll later, and with LISTEN off too. Such a claim is
        bounded by the jobs that finish, so an empty one never lengthens the gap that empty
        claims after NOTIFY wake-ups impose.
        """
        if self._completer is not None and self._completer.pending():
            return  # (a success's own write calls this while it is pending)
        self._after_finish = True
        self._wake.set()

    # the completer's ClaimAlong
    def reserve(self) -> int:
        """How many jobs a write of successes may claim now; held for it until `adopt` or `release`."""
        return self._reserve()

    def params(self, batch: int, lease_token: uuid.UUID) -> dict[str, Any]:
        """The claim's arguments for `claim_statement` and `cycle_statement` (batch, lease_token)."""
        return {"batch": batch, "lease_token": str(lease_token)}

    def adopt(self, rows: list[tuple[Any, ...]], asked: int, *, inline: bool = False) -> list[Any]:
        """Run the jobs claimed (`asked` were asked for): rows of _sql.CLAIMED_NAMES.

        The caller's reservation of `asked` slots (`reserve`) ends here, once the jobs hold
        their slots (tracked), not before: a claim meanwhile never counts those slots free.
        With `inline` (the completer's write), while handlers are quick, the first jobs whose
        handler is a plain function, as many as take INLINE_BUDGET together on average, are
        returned for `run_in_turn` on the caller's thread; the others go to handler threads.
        """
        # a limited queue may give fewer than asked while more wait: a freed slot claims again
        self._more_waiting = len(rows) >= asked or (self._limited and bool(rows))
        if not rows:
            self.release(asked)
            return []
        average = self._handler_time
        if not inline or average is None or average >= INLINE_HANDLER:
            return self._dispatch(rows, reserved=asked)
        return self._dispatch(rows, len(rows) if average <= 0 else max(1, int(INLINE_BUDGET / average)), asked)

    def run_in_turn(self, calls: list[Any]) -> None:
        """Run the jobs `adopt` returned, on this thread."""
        assert self._executor is not None
        self._executor.run_in_turn(calls)

    def recover(self, lease_token: uuid.UUID) -> None:
        """The answer was lost: run what a claim under `lease_token` committed, if it did."""
        adopted = self._claimed(lease_token)
        if adopted:
            log.warning(
                "worker %s: the lost claim had committed; running its %d jobs", self._options.worker_id, len(adopted)
            )
            self._dispatch(adopted)

    def release(self, reserved: int) -> None:
        """The claim that held `reserved` slots is over."""
        with self._lock:
            self._reserved -= reserved

    # the claim
    def _read_limits(self) -> None:
        """Every few seconds, whether this worker's queues are limited (treadle.queue_settings)."""
        now = time.monotonic()
        if now - self._limits_read_at < LIMITS_INTERVAL:
            return
        self._limits_read_at = now
        try:
            row = self._pool.rows(_sql.QUEUE_LIMITS, {"queues": self._queues})[0]
        except psycopg.Error as error:  # a role granted before 0.3.0 may not read the view: no limits then
            log.debug("worker %s: could not read queue limits (%s)", self._options.worker_id, one_line(error))
            return
        self._limited = bool(row["limited"])
        slot = row["rate_slot"]
        self._rate_wait = None if slot is None else min(self._options.poll_interval, max(RATE_WAIT_FLOOR, slot))

    def _reserve(self, *, for_loop: bool = False) -> int:
        """How many jobs a claim may take now, held for it until `adopt` or `release`.

        The claim loop leaves the claim to the next write of successes when one is on
        its way and more work is waiting. A write of successes always claims for the
        room there is: the jobs it finishes may have made work for this worker (a
        handler's enqueue, committed before the handler returned; a workflow's next
        step, written by the same statement), and no NOTIFY need say so. Where the
        queue is empty that is a claim that finds nothing, inside a statement sent anyway.
        """
        assert self._completer is not None
        if self._host.stopping:
            return 0
        if for_loop:
            if self._more_waiting and self._completer.pending():
                return 0
        with self._lock:
            room = self._options.concurrency + self._ahead() - self._host.holding() - self._reserved
            if room <= 0:
                return 0
            room = min(room, MAX_CONCURRENCY)
            self._reserved += room
            return room

    def _ahead(self) -> int:
        """How many jobs to hold beyond the free slots now."""
        if not self._options.ahead_if_quick:
            return self._options.claim_ahead
        average = self._handler_time
        if average is None or average >= QUICK_HANDLER:
            return 0
        if average < INLINE_HANDLER:
            return min(QUICK_AHEAD * self._options.claim_ahead, MAX_CONCURRENCY)
        return self._options.claim_ahead

    def _claim(self, free: int, backoff: Backoff) -> list[tuple[Any, ...]] | None:
        """Claim up to `free` jobs; None after a failure (the loop then tries again).

        Each call has a lease token of its own. When the connection fails during the
        claim, the claim may have committed with its answer lost on the way back:
        the jobs holding that token are read back and adopted, not left running
        under a token nobody holds until a rescue spends their attempt.
        """
        token = uuid.uuid4()
        try:
            return self._pool.tuples(self.claim_statement, self.params(free, token))
        except psycopg.Error as error:
            worker_id = self._options.worker_id
            delay = backoff.next()
            log.warning("worker %s: claim failed (%s); retrying in %.1f s", worker_id, one_line(error), delay)
            if is_transient(error):
                adopted = self._claimed(token)
                if adopted:
                    log.warning("worker %s: the lost claim had committed; running its %d jobs", worker_id, len(adopted))
                    return adopted
            sleep_until_stopped(self._host, delay)
            return None

    def _claimed(self, token: uuid.UUID) -> list[tuple[Any, ...]]:
        """The jobs a claim whose answer was lost committed, read back on a fresh connection."""
        backoff = Backoff()
        while not self._host.stopping:
            try:
                return self._pool.tuples(_sql.CLAIMED, {"lease_token": token})
            except psycopg.Error as error:
                delay = backoff.next()
                log.warning(
                    "worker %s: could not ask what the lost claim committed (%s); retrying in %.1f s",
                    self._options.worker_id,
                    one_line(error),
                    delay,
                )
                sleep_until_stopped(self._host, delay)
        return []  # stopping: whatever it claimed keeps its lease until a rescue returns it

    def _wait_for_work(self) -> bool:
        """Until the poll interval passes, NOTIFY or a freed slot wakes the loop, or a stop; True when woken.

        On a rate-limited queue the wait is at most a slot's length (at least 50 ms),
        so the queue drains at its rate. After claims that wake-ups started found
        nothing (a paused or full queue that NOTIFY keeps announcing, jobs other
        workers took), a wake-up first waits out a gap that doubles from 20 ms up
        to the poll interval: such a queue is never claimed in a hot loop.
        """
        poll_interval = self._options.poll_interval
        start = time.monotonic()
        deadline = start + (self._rate_wait or poll_interval)
        gap = 0.0 if self._woken_empty < 1 else min(poll_interval, EMPTY_CLAIM_GAP * 2 ** (self._woken_empty - 1))
        woken = False
        while not self._host.stopping:
            now = time.monotonic()
            if now >= deadline:
                return woken
            if woken:
                if now >= start + gap or self._after_finish:
                    return True
                time.sleep(min(start + gap - now, WAIT_SLICE))
            elif self._wake.wait(min(deadline - now, WAIT_SLICE)):
                self._wake.clear()
                woken = True
        return woken

    # handing claimed jobs on
    def _dispatch(self, rows: list[tuple[Any, ...]], inline: int = 0, reserved: int = 0) -> list[Any]:
        """Track and start the claimed jobs; up to `inline` of them, to run on this thread, are returned.

        The `reserved` slots of their claim are given back once every job is tracked (holds its
        slot), before the slower part: their steps' inputs read, their events, their start.
        """
        assert self._executor is not None and self._deferred is not None
        deferred = self._deferred
        taken: list[tuple[RunState, Claimed]] = []
        try:
            for row in rows:
                claimed: Claimed = decode_claimed(row, deferred)
                run = RunState(claimed.job, on_lost=self._host.lease_lost)
                self._host.track(run)
                taken.append((run, claimed))
        finally:
            if reserved:
                self.release(reserved)
        step_runs = self._step_runs(rows)
        executor = self._executor
        executor.claimed_batch()
        here: list[Any] = []
        taking: list[Any] | None = here if inline else None  # None once `inline` are taken
        for run, claimed in taken:
            self._host.emit("claimed", run)
            executor.submit(run, claimed, step_runs.get((run.run_id, run.step)), taking)
            if taking is not None and len(here) >= inline:
                taking = None  # the rest go to handler threads
        return here

    def _step_runs(self, rows: list[tuple[Any, ...]]) -> dict[tuple[int | None, str | None], dict[str, Any]]:
        """The workflow, input and dependencies' results of the steps just claimed, in one query."""
        steps = sorted({(row[STEP_RUN], row[STEP_NAME]) for row in rows if row[STEP_RUN] is not None})
        if not steps:
            return {}
        params = {"run_ids": [run_id for run_id, _ in steps], "steps": [step for _, step in steps]}
        try:
            return {(run["id"], run["step"]): run for run in self._pool.rows(_sql.STEP_CONTEXT, params)}
        except psycopg.Error as error:
            # each step then reads its own run before it starts
            log.warning("worker %s: reading workflow runs failed (%s)", self._options.worker_id, one_line(error))
            return {}
