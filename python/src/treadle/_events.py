"""What a worker tells its `on_event` callback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from treadle.models import Job, JobFields

EventKind = Literal[
    "claimed",  # the worker holds a lease on the job
    "started",  # its handler (or workflow step) was called
    "completing",  # the handler returned; its completion is about to be written
    "completed",  # the completion committed (state: completed)
    "failed",  # a failure was recorded (state: retryable or discarded)
    "cancelled",  # the job ended as cancelled (a cancel was requested while it ran)
    "lease_lost",  # the lease no longer holds the job: nothing from this run is written
    "released",  # handed back at shutdown (state: available, or cancelled)
    "snoozed",  # the handler raised Snooze: available again later, its attempt given back
]


@dataclass(frozen=True)
class WorkerEvent(JobFields):
    """One thing that happened to one job in a worker."""

    kind: EventKind
    job: Job
    worker_id: str
    state: str | None = None  # the job's state after this event's write, when it wrote one
    error: str | None = None  # the failure, for failed and lease_lost
