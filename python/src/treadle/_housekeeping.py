"""The worker's timed chores: heartbeats for running jobs, rescue of expired leases, the registry.

One thread does all three; each statement that fails (the database went away) is
tried again soon, and a chore never stops the others for long.
"""

from __future__ import annotations

import logging
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


class Housekeeper:
    """A thread that heartbeats `running()` jobs (one statement for all), calls rescue() and worker_seen()."""

    def __init__(
        self,
        pool: WorkerPool,
        worker_id: str,
        *,
        lease: float,
        heartbeat_interval: float,
        rescue_interval: float,
        running: Callable[[], list[RunState]],
        on_rescued: Callable[[int], None],
        seen_params: Callable[[], dict[str, Any]],
    ) -> None:
        self._pool = pool
        self._worker_id = worker_id
        self._lease = timedelta(seconds=lease)
        self._heartbeat_interval = heartbeat_interval
        self._rescue_interval = rescue_interval
        self._running = running
        self._on_rescued = on_rescued
        self._seen_params = seen_params
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="treadle-housekeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        next_rescue = time.monotonic()
        next_seen = time.monotonic() + SEEN_INTERVAL  # the worker reported itself at start
        backoff = Backoff(cap=1.0)
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                next_beat = self._heartbeat_due(now)
                if now >= next_rescue:
                    self._rescue()
                    next_rescue = now + self._rescue_interval
                if now >= next_seen:
                    self._pool.value(_sql.WORKER_SEEN, self._seen_params())
                    next_seen = now + SEEN_INTERVAL
                backoff.reset()
                delay = min(next_beat, next_rescue, next_seen) - time.monotonic()
            except psycopg.Error as error:
                delay = backoff.next()
                log.warning(
                    "worker %s: heartbeat or rescue failed (%s); retrying in %.1f s",
                    self._worker_id,
                    one_line(error),
                    delay,
                )
            self._stop.wait(max(delay, 0.01))

    def _heartbeat_due(self, now: float) -> float:
        """Extend the leases whose heartbeat is due; returns when the next one is."""
        running = self._running()
        due = [run for run in running if now - run.last_beat >= self._heartbeat_interval]
        if due:
            # one statement for every due lease of the worker
            answers = self._pool.tuples(
                _sql.HEARTBEAT_MANY,
                {
                    "job_ids": [run.job_id for run in due],
                    "lease_tokens": [run.lease_token for run in due],
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

    def _rescue(self) -> None:
        rescued = self._pool.value(_sql.RESCUE)
        if rescued:
            log.info("worker %s rescued %d jobs whose lease expired", self._worker_id, rescued)
            self._on_rescued(int(rescued))
