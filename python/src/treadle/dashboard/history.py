"""A job's attempts, oldest first, from what the database keeps of them.

Each failed attempt leaves an entry in the job's `errors` (attempt number, time
of the failure, error text, and since 0.3.0 the worker that ran it and when it
started; the newest 20 are kept). The job itself keeps its latest claim:
`started_at` and `worker_id`. Entries written by 0.2.0 lack worker and start: for
those the worker is known only when a lease expired (its error names it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from .queries import RawJson, Row

KEPT_ERRORS: Final = 20  # treadle._append_error keeps this many
LEASE_EXPIRED: Final = re.compile(r"^lease expired: worker (.+) stopped heartbeating$")


@dataclass(frozen=True)
class Attempt:
    number: int | None  # the job's attempt counter then (retry() restarts it at 1)
    worker: str | None  # None: not recorded
    started: datetime | None  # None: not recorded
    ended: datetime | None  # None: still running
    outcome: str  # 'failed', or the job's state for its latest attempt
    error: str | None


def attempts(job: Row) -> list[Attempt]:
    """The job's attempts that the database remembers, oldest first."""
    errors = job.get("errors")
    entries = errors if isinstance(errors, list) else []
    history = [_failed(entry) for entry in entries if isinstance(entry, dict)]
    started, worker = job.get("started_at"), job.get("worker_id")
    if started is None:
        return history
    last = history[-1] if history else None
    if last is not None and last.number == job.get("attempt") and last.ended is not None and last.ended >= started:
        # the latest claim is the latest failure's
        history[-1] = Attempt(last.number, last.worker or worker, started, last.ended, last.outcome, last.error)
    elif job["state"] != "available" or job.get("attempt"):
        # the latest claim has not failed: it runs, or it finished otherwise
        history.append(Attempt(job.get("attempt"), worker, started, job.get("finished_at"), job["state"], None))
    return history


def truncated(job: Row) -> bool:
    """Whether older failures may have been dropped from the job's history."""
    errors = job.get("errors")
    return isinstance(errors, list) and len(errors) >= KEPT_ERRORS


def _failed(entry: dict[str, Any]) -> Attempt:
    raw_error = entry.get("error")
    if raw_error is None or isinstance(raw_error, str):
        error = raw_error
    elif isinstance(raw_error, RawJson):
        error = raw_error.text
    else:
        error = json.dumps(raw_error, ensure_ascii=False)
    expired = LEASE_EXPIRED.match(error or "")
    number = entry.get("attempt")
    worker = entry.get("worker")
    return Attempt(
        number=number if isinstance(number, int) and not isinstance(number, bool) else None,
        worker=worker if isinstance(worker, str) else expired.group(1) if expired else None,
        started=_timestamp(entry.get("started_at")),
        ended=_timestamp(entry.get("at")),
        outcome="failed",
        error=error,
    )


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
