"""Plain data the client returns."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, get_args

JobState = Literal["available", "running", "retryable", "completed", "discarded", "cancelled", "blocked"]

JOB_STATES: tuple[str, ...] = get_args(JobState)  # in the order the CHECK constraint lists them
FINISHED_STATES: frozenset[str] = frozenset({"completed", "discarded", "cancelled"})


@dataclass(frozen=True)
class Job:
    """One row of treadle.jobs (from treadle.job_details, which leaves out the lease token)."""

    id: int
    queue: str
    name: str
    args: Any
    state: JobState
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int
    lease_until: datetime | None
    worker_id: str | None
    idempotency_key: str | None
    result: Any
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None
    workflow_run_id: int | None
    step: str | None
    lease_token: Any = None  # the worker's write credential: only claimed rows carry it
    every: timedelta | None = None
    next_id: int | None = None
    cancel_requested: bool = False
    started_at: datetime | None = None
    failed_at: datetime | None = None
    errors: Any = None
    progress: float | None = None
    progress_message: str | None = None
    timeout: timedelta | None = None  # how long one attempt may run
    backoff: list[timedelta] | None = None  # the job's own delays before retries 1, 2, ...
    meta: Any = None  # the producer's metadata (a dict, e.g. trace context), or None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """Build from a dict row of treadle.jobs; columns added by later versions are ignored."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in row.items() if k in known})

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def __getstate__(self) -> dict[str, Any]:
        # a copy or a pickle holds every field, also those a claimed job has not taken apart yet
        state = self.__dict__
        if DEFERRED_KEY in state:
            for field in fields(self):
                getattr(self, field.name)
        return state


# A Job the worker claimed keeps the fields it has no use for as they came (DeferredFields,
# under this key of its __dict__) until one of them is read: most jobs run without anyone
# reading them, and taking them apart is most of the client's cost of a claimed row.
DEFERRED_KEY = "_deferred_fields"


class DeferredFields(Protocol):
    def load(self) -> dict[str, Any]:
        """The fields, by name."""
        ...


class _Field:
    """A Job field as read through the class: its default (AttributeError without one) from the
    class, and from a claimed job that kept it deferred, the field taken apart on first read.

    Not a data descriptor: a field in an instance's __dict__ (every field of a Job made
    any other way, and a deferred one once read) is found there first.
    """

    __slots__ = ("default", "name")

    def __init__(self, name: str, default: Any) -> None:
        self.name = name
        self.default = default

    def __get__(self, job: Job | None, owner: type | None = None) -> Any:
        if job is None:
            if self.default is MISSING:
                raise AttributeError(f"type object 'Job' has no attribute '{self.name}'")
            return self.default
        values = job.__dict__
        deferred: DeferredFields | None = values.get(DEFERRED_KEY)
        if deferred is None:
            # another thread may have taken the fields apart since this read looked in __dict__
            try:
                return values[self.name]
            except KeyError:
                raise AttributeError(f"'Job' object has no attribute '{self.name}'") from None
        # two threads may both get here: each writes the same values
        values.update(deferred.load())
        values.pop(DEFERRED_KEY, None)
        return values[self.name]


for _job_field in fields(Job):
    setattr(Job, _job_field.name, _Field(_job_field.name, _job_field.default))
del _job_field


@dataclass(frozen=True)
class Explanation:
    """One reason `explain` gives for where a job is (a row of treadle.explain).

    ``reason`` is a stable key (``not_due``, ``paused``, ``concurrency_limit``,
    ``rate_limit``, ``no_worker``, ``behind``, ``ready``, ``retrying``, ``running``,
    ``worker``, ``lease_expired``, ``cancel_requested``, ``completed``,
    ``discarded``, ``cancelled``), ``message`` says it in words, ``at`` is the
    time it names, if any.
    """

    reason: str
    message: str
    at: datetime | None


@dataclass(frozen=True)
class RunExplanation:
    """One reason `explain_run` gives for where a workflow run is (a row of treadle.explain_run).

    The first has ``step`` None and ``reason`` ``run``: the run summed up (its
    workflow, queue, state and the steps completed); a finished run has only that
    one. Then, for each step not completed, in step order: ``dependencies`` (the
    steps it waits for), ``sleeping`` (until ``at``), ``signal`` (the signal it
    waits for, until ``at`` or with no timeout), ``map`` (its element jobs not
    completed), or the reasons `explain` gives its job (``job_id``).
    """

    step: str | None
    job_id: int | None
    reason: str
    message: str
    at: datetime | None


class JobFields:
    """Shortcuts to the fields of `self.job` that handlers and event hooks use most."""

    job: Job

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def args(self) -> Any:
        return self.job.args

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def meta(self) -> Any:
        """The metadata the producer passed to enqueue (a dict), or None."""
        return self.job.meta

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def run_id(self) -> int | None:
        """The workflow run, when this job is a workflow step."""
        return self.job.workflow_run_id

    @property
    def step(self) -> str | None:
        return self.job.step
