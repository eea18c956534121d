"""The worker's timed chores: heartbeats for running jobs, rescue of expired leases, the registry,
and retention (deleting finished work past its retention, and moving finished jobs to treadle.job_history,
one small batch at a time).

One thread does them all; each statement that fails (the database went away) is
tried again soon, and a chore never stops the others for long: retention deletes one
batch per turn, a short transaction, and comes back at once only while there is more.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from . import _sql
from ._pool import WorkerPool
from ._retry import Backoff, one_line
from ._run_state import HeartbeatAnswer, RunState

log = logging.getLogger("treadle.worker")

SEEN_INTERVAL = 5.0  # how often the worker reports itself in treadle.workers
RETENTION_CATCH_UP = 0.05  # seconds between retention batches while a backlog is deleted


class Housekeeper:
    """A thread that heartbeats `running()` jobs (one statement for all), calls rescue(), worker_seen() and,
    unless `retention_interval` is None, apply_retention(retention_batch) and archive(retention_batch)."""

    def __init__(
        self,
        pool: WorkerPool,
        worker_id: str,
        *,
        lease: float,
        heartbeat_interval: float,
        rescue_interval: float,
        retention_interval: float | None,
        retention_batch: int,
        running: Callable[[], list[RunState]],
        on_rescued: Callable[[int], None],
        seen_params: Callable[[], dict[str, Any]],
    ) -> None:
        self._pool = pool
        self._worker_id = worker_id
        self._lease = timedelta(seconds=lease)
        self._heartbeat_interval = heartbeat_interval
        self._rescue_interval = rescue_interval
        self._retention_interval = retention_interval
        self._retention_batch = retention_batch
        self._running = running
        self._on_rescued = on_rescued
        self._seen_params = seen_params
        self._stop = threading.Event()
        self._nudge = threading.Event()  # set by stop() and heartbeat_now(): look before the next chore is due
        self._urgent: set[int] = set()  # job ids to heartbeat at once, whenever their last beat was
        self._urgent_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="treadle-housekeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._nudge.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        next_rescue = time.monotonic()
        next_seen = time.monotonic() + SEEN_INTERVAL  # the worker reported itself at start
        next_retention = time.monotonic() if self._retention_interval is not None else math.inf
        backoff = Backoff(cap=1.0)
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                next_beat = self._heartbeat_due(now)
                if now >= next_rescue:
                    # (at once again while a rescue leaves workflow runs due: a sleep then ends late
                    # only by the time the rescues before it take)
                    next_rescue = now if self._rescue() else now + self._rescue_interval
                if now >= next_seen:
                    self._pool.value(_sql.WORKER_SEEN, self._seen_params())
                    next_seen = now + SEEN_INTERVAL
                if now >= next_retention:
                    next_retention = self._retain(now)
                backoff.reset()
                delay = min(next_beat, next_rescue, next_seen, next_retention) - time.monotonic()
            except psycopg.Error as error:
                delay = backoff.next()
                log.warning(
                    "worker %s: heartbeat, rescue or retention failed (%s); retrying in %.1f s",
                    self._worker_id,
                    one_line(error),
                    delay,
                )
            self._nudge.wait(max(delay, 0.01))
            self._nudge.clear()

    def heartbeat_now(self, job_id: int) -> None:
        """Heartbeat this running job now, not at its next beat: a cancel of it was announced,
        and the heartbeat's answer says whether it holds (a notification is only a hint)."""
        with self._urgent_lock:
            self._urgent.add(job_id)
        self._nudge.set()

    def _heartbeat_due(self, now: float) -> float:
        """Extend the leases whose heartbeat is due; returns when the next one is."""
        running = self._running()
        with self._urgent_lock:
            urgent, self._urgent = self._urgent, set()
        due = [run for run in running if now - run.last_beat >= self._heartbeat_interval or run.job_id in urgent]
        if due:
            # one statement for every due lease of the worker
            answers = self._pool.tuples(
                _sql.HEARTBEAT_MANY,
                {
                    "job_ids": [run.job_id for run in due],
                    "lease_tokens": [run.lease_token for run in due],
                    "job_queues": [run.queue for run in due],
                    "lease": self._lease,
                },
            )
            for run, (answer,) in zip(due, answers, strict=True):
                parsed = HeartbeatAnswer(answer)
                if parsed is HeartbeatAnswer.CANCEL and not run.cancel_requested:
                    log.info("job %d (%s): cancel requested; its handler sees ctx.cancelled", run.job_id, run.name)
                run.apply_heartbeat(parsed)
        return min(
            (run.last_beat + self._heartbeat_interval for run in running), default=now + self._heartbeat_interval
        )

    def _rescue(self) -> bool:
        """Rescue jobs whose lease expired; whether workflow runs due are left for another call."""
        ((rescued, left),) = self._pool.tuples(_sql.RESCUE)
        if rescued:
            log.info("worker %s rescued %d jobs whose lease expired", self._worker_id, rescued)
            self._on_rescued(int(rescued))
        return bool(left)

    def _retain(self, now: float) -> float:
        """Delete one batch of finished work past its retention, then move one batch of finished jobs to
        treadle.job_history; returns when to go again."""
        assert self._retention_interval is not None
        params = {"batch": self._retention_batch}
        try:
            deleted = int(self._pool.value(_sql.APPLY_RETENTION, params) or 0)
            moved = int(self._pool.value(_sql.ARCHIVE, params) or 0)
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction) as error:
            log.warning(
                "worker %s: retention is off: %s (grant_worker gives treadle.apply_retention and treadle.archive; "
                "retention_interval=None turns it off)",
                self._worker_id,
                one_line(error),
            )
            return math.inf
        if deleted:
            log.info("worker %s deleted %d finished jobs past their retention", self._worker_id, deleted)
        if moved:
            log.debug("worker %s moved %d finished jobs to treadle.job_history", self._worker_id, moved)
        # a full batch says there may be more: the next one soon, between the other chores
        more = max(deleted, moved) >= self._retention_batch
        return now + (RETENTION_CATCH_UP if more else self._retention_interval)
