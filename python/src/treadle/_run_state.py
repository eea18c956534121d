"""The worker's own view of one claimed run of a job: its status, its lease, and who settles it.

A handler sees a `JobContext`; the worker's pieces (executor, completer,
housekeeper, the claim loop) see this. Exactly one way out of RUNNING wins, under
the lock: the handler finishes (FINISHING, then the completer writes), the
handler completes the job itself (COMPLETED, `complete_in`), the worker hands it
back at shutdown (RELEASED), or the lease is found gone (`lost`).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from uuid import UUID

from .models import Job, JobFields


class RunStatus(enum.Enum):
    RUNNING = "running"  # the handler works
    FINISHING = "finishing"  # the handler is done; the worker writes its outcome
    COMPLETED = "completed"  # the handler completed the job itself (complete_in)
    RELEASED = "released"  # handed back at shutdown; nothing more is written
    LOST = "lost"  # the lease no longer holds the job; nothing more is written


class HeartbeatAnswer(enum.Enum):
    HELD = "held"
    CANCEL = "cancel"  # held, and a cancel was requested
    LOST = "lost"


class RunState(JobFields):
    """One claimed job as the worker tracks it; `cancelled` is what its handler watches."""

    def __init__(self, job: Job, on_lost: Callable[[RunState], None] | None = None) -> None:
        token = job.lease_token
        assert token is not None, "a claimed job always has a lease token"
        self.job = job
        self.lease_token: UUID = token if isinstance(token, UUID) else UUID(str(token))
        # `cancelled`, made when first asked for: most handlers never look, and an Event
        # costs about as much to make as the rest of a RunState
        self._cancelled: threading.Event | None = None
        self._fired = False  # cancelled is set, or will be when it is made
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._status = RunStatus.RUNNING
        self._handler_started = False
        self._handler_returned = False
        self._cancel_requested = False
        self._hooks: list[Callable[[], object]] = []
        self._completed_state: str | None = None
        self._last_beat = time.monotonic()
        self._timed_out_after: float | None = None  # seconds, once the attempt ran past its timeout

    def __repr__(self) -> str:
        return f"<RunState job {self.job_id} {self.name!r} attempt {self.attempt} {self._status.value}>"

    @property
    def cancelled(self) -> threading.Event:
        """Set when the handler should stop: a cancel, a lost lease, a timeout or a hand-back."""
        event = self._cancelled
        if event is None:
            with self._lock:
                event = self._cancelled
                if event is None:
                    event = self._cancelled = threading.Event()
                    if self._fired:
                        event.set()
        return event

    # what the worker reads
    @property
    def status(self) -> RunStatus:
        return self._status

    @property
    def lost(self) -> bool:
        return self._status is RunStatus.LOST

    @property
    def holds_slot(self) -> bool:
        """Its handler has not returned (or not started), and nobody settled the job without it."""
        return not self._handler_returned and self._status in (RunStatus.RUNNING, RunStatus.LOST)

    @property
    def busy(self) -> bool:
        """Its handler runs (it started and has not returned), unless the job was settled without it."""
        return self._handler_started and self.holds_slot

    @property
    def needs_heartbeat(self) -> bool:
        # past its timeout a job is not kept: a handler that ignores the cancel loses the lease
        return self._status is RunStatus.RUNNING and self._timed_out_after is None

    @property
    def timed_out_after(self) -> float | None:
        """The timeout (seconds) the attempt ran past, or None."""
        return self._timed_out_after

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested

    @property
    def completed_state(self) -> str | None:
        """The state complete_in left the job in ('completed' or 'cancelled')."""
        return self._completed_state

    @property
    def last_beat(self) -> float:
        """When the lease was last extended (time.monotonic())."""
        return self._last_beat

    # the handler's turn
    def begin_handler(self) -> bool:
        """A slot takes the job (a handler thread, or the event loop for an async handler):
        True when its handler is to run.

        False when the job was handed back or its lease lost while it waited for a
        slot (a job claimed ahead of free slots); the job then holds no slot.
        """
        with self._lock:
            if self._status is RunStatus.RUNNING:
                self._handler_started = True
                return True
            self._handler_returned = True
            return False

    # the ways out of RUNNING
    def begin_finishing(self) -> RunStatus:
        """The handler returned: FINISHING when its outcome is for the worker to write.

        Otherwise the status that already settled the job (COMPLETED, RELEASED or LOST).
        """
        with self._lock:
            self._handler_returned = True
            if self._status is RunStatus.RUNNING:
                self._status = RunStatus.FINISHING
                return RunStatus.FINISHING
            if self._status is RunStatus.FINISHING:
                return RunStatus.LOST  # a second finish of the same run cannot write again
            return self._status

    def complete(self, state: str) -> None:
        """The handler completed the job itself; the worker writes nothing more."""
        with self._lock:
            self._status = RunStatus.COMPLETED
            self._completed_state = state

    def release(self, *, only_unstarted: bool = False) -> bool:
        """Mark the job handed back at shutdown; False when its handler already finished or the lease is gone.

        With `only_unstarted`, only a job whose handler has not started (claimed ahead).
        """
        with self._lock:
            if self._status is not RunStatus.RUNNING or (only_unstarted and self._handler_started):
                return False
            self._status = RunStatus.RELEASED
        self._fire()
        return True

    def mark_lost(self, *, only_while_running: bool = False) -> bool:
        """Record that the lease is gone; True the first time.

        A job handed back or completed by its handler has no lease to lose; with
        `only_while_running`, neither has one whose outcome is being written (the
        token may be gone because that outcome was just written).
        """
        with self._lock:
            allowed = (RunStatus.RUNNING,) if only_while_running else (RunStatus.RUNNING, RunStatus.FINISHING)
            if self._status not in allowed:
                return False
            self._status = RunStatus.LOST
        self._fire()
        if self._on_lost is not None:
            self._on_lost(self)
        return True

    def time_out(self, seconds: float) -> None:
        """The attempt ran past its timeout: cancel the handler (`cancelled`); its outcome becomes a timeout."""
        with self._lock:
            if self._status is not RunStatus.RUNNING or self._handler_returned:
                return
            self._timed_out_after = seconds
        self._fire()

    # the lease
    def apply_heartbeat(self, answer: HeartbeatAnswer) -> None:
        if answer is HeartbeatAnswer.LOST:
            self.mark_lost(only_while_running=True)
            return
        self._last_beat = time.monotonic()
        if answer is HeartbeatAnswer.CANCEL:
            self._cancel_requested = True
            self._fire()

    def on_cancelled(self, hook: Callable[[], object]) -> None:
        """Call `hook` when `cancelled` is set (at once if it is already)."""
        with self._lock:
            if not self._fired:
                self._hooks.append(hook)
                return
        hook()

    def _fire(self) -> None:
        with self._lock:
            self._fired = True
            if self._cancelled is not None:
                self._cancelled.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()
