"""The worker: claims jobs, runs Python handlers and workflow steps, and finishes them.

Every state decision is the extension's: the worker asks a SQL function (claim,
heartbeat, complete_many, fail, release, rescue) and obeys its answer.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from functools import partial
from types import FrameType
from typing import Any, NamedTuple, TypeVar, overload

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from treadle import _args, _sql
from treadle._batcher import CompletionBuffer
from treadle._context import COMPLETED, FINISHING, RUNNING, JobContext
from treadle._db import Backoff, Database, check_extension, is_transient, one_line
from treadle._events import EventKind, WorkerEvent
from treadle._execution import HandlerThreads
from treadle._housekeeping import Housekeeper
from treadle._json import to_jsonb
from treadle._listener import Listener
from treadle._outcomes import UNWRITTEN, Completion, Outcomes
from treadle.errors import InvalidArgument, LeaseLost
from treadle.models import Job

__all__ = ["Handler", "JobContext", "Step", "StepFunction", "Worker", "WorkerEvent"]

log = logging.getLogger("treadle.worker")

Handler = Callable[[Any, JobContext], Any]
StepFunction = Callable[[Any, dict[str, Any], JobContext], Any]
Duration = float | timedelta  # seconds, or a timedelta
F = TypeVar("F", bound=Callable[..., Any])

WORKFLOW_PREFIX = "workflow:"  # a workflow's step jobs are named workflow:<name>
COMPLETION_DELAY = 0.005  # how long a success waits to be finished together with others
WAIT_SLICE = 0.1  # longest single wait in run(): signal handlers only set flags
RELEASE_GRACE = 5.0  # how long a graceful stop retries hand-backs while the database is away
FINISH_GRACE = 2.0  # how long a stop waits for outcomes already being written
MAX_CONCURRENCY = 1000  # treadle.claim takes at most this many jobs at once


class Step(NamedTuple):
    """One step of a workflow: its name and `fn(input, results, ctx)`."""

    name: str
    fn: StepFunction


class Worker:
    """Claims jobs from `queues` and runs the handlers and workflows registered on it.

    `dsn_or_pool` is a connection string (the worker then owns a small pool) or a
    psycopg_pool.ConnectionPool the application already runs. Durations are seconds
    or timedeltas: `poll_interval` (claim at least this often; LISTEN/NOTIFY wakes
    it sooner), `lease` (how long a claim holds a job without a heartbeat),
    `heartbeat_interval` (shorter than the lease), `rescue_interval` (how often to
    return the jobs of dead workers), `stop_timeout`. `backoff(attempt)` gives the
    delay in seconds before a failed attempt runs again (the SQL default when
    None). `on_error(exc, job)` hears every exception a handler raised;
    `on_event(WorkerEvent)` hears claimed, started, completing, completed, failed,
    cancelled, lease_lost and released.

    Handlers are called as `fn(args, ctx)` in a pool of `concurrency` threads
    (`async def` handlers run on an event loop thread); their JSON return value
    becomes the job's result. Workflow steps are called as `fn(input, results, ctx)`.

    Stopping: SIGTERM or SIGINT (when `run()` is in the main thread) or `stop()`
    stops claiming at once and lets running handlers finish for up to
    `stop_timeout`. What has not finished by then is handed back with
    treadle.release: the job is available again at once with its attempt given
    back, and its handler's `ctx.cancelled` is set (whatever it returns later is
    not written). A second signal, or `stop(immediate=True)`, hands back at once
    without waiting. A job whose hand-back cannot reach the database keeps its
    lease until it lapses; a rescue then returns it.
    """

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool,
        queues: Sequence[str] = ("default",),
        concurrency: int = 10,
        *,
        poll_interval: Duration = 1.0,
        lease: Duration = 30,
        heartbeat_interval: Duration = 10,
        rescue_interval: Duration = 0.5,
        stop_timeout: Duration = 30,
        backoff: Callable[[int], Duration] | None = None,
        on_error: Callable[[BaseException, Job], None] | None = None,
        on_event: Callable[[WorkerEvent], None] | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.queues = _check_queues(queues)
        self.concurrency = _args.integer(concurrency, "concurrency", (1, MAX_CONCURRENCY))
        self.poll_interval = _args.seconds(poll_interval, "poll_interval", allow_zero=False)
        self.lease = _args.seconds(lease, "lease", allow_zero=False)
        self.heartbeat_interval = _args.seconds(heartbeat_interval, "heartbeat_interval", allow_zero=False)
        self.rescue_interval = _args.seconds(rescue_interval, "rescue_interval", allow_zero=False)
        self.stop_timeout = _args.seconds(stop_timeout, "stop_timeout", allow_zero=True)
        if self.heartbeat_interval >= self.lease:
            raise InvalidArgument(
                f"heartbeat_interval ({self.heartbeat_interval:g} s) must be shorter than lease ({self.lease:g} s)")
        for option, callback in (("backoff", backoff), ("on_error", on_error), ("on_event", on_event)):
            if callback is not None and not callable(callback):
                raise InvalidArgument(f"{option} must be callable or None, not {type(callback).__name__}")
        self._backoff = backoff
        self._on_error = on_error
        self._on_event = on_event
        if worker_id is None:
            worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.worker_id = _check_name(worker_id, "worker_id")
        self._db = Database(dsn_or_pool, f"treadle-worker:{self.worker_id}", min(self.concurrency, 16) + 3)
        self._outcomes = Outcomes(self._db, self.worker_id, emit=self._emit, done=self._done,
                                  retry_in=self._retry_in)

        self._handlers: dict[str, Handler] = {}
        self._workflows: dict[str, dict[str, StepFunction]] = {}
        self._active: set[JobContext] = set()  # claimed and not yet settled, keyed by run, not job id
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._finished = threading.Event()
        self._stop_requested = False
        self._stop_immediate = False
        self._signals: list[int] = []
        self._more_waiting = False  # the last claim filled every free slot
        self._used = False
        self._thread: threading.Thread | None = None
        self._background_error: BaseException | None = None
        self._threads: HandlerThreads | None = None
        self._buffer: CompletionBuffer[Completion] | None = None

    # registration
    @overload
    def register(self, name: F) -> F: ...
    @overload
    def register(self, name: str) -> Callable[[F], F]: ...
    @overload
    def register(self, name: str, fn: F) -> F: ...
    def register(self, name: str | Callable[..., Any], fn: Callable[..., Any] | None = None) -> Any:
        """Register `fn(args, ctx)` for jobs called `name`; returns `fn`.

        Also a decorator: `@worker.register("name")`, or bare `@worker.register`
        (the function's own name is the job name).
        """
        if fn is None:
            if callable(name):
                return self.register(name.__name__, name)
            return lambda f: self.register(name, f)
        self._check_not_started()
        job_name = _check_name(name, "handler name")
        if job_name.startswith(WORKFLOW_PREFIX):
            raise InvalidArgument(
                f"handler name {job_name!r}: names starting with {WORKFLOW_PREFIX!r} belong to workflow "
                "steps; register workflows with worker.workflow()")
        if not callable(fn):
            raise InvalidArgument(f"the handler for {job_name!r} must be callable, not {type(fn).__name__}")
        if job_name in self._handlers:
            raise InvalidArgument(f"a handler for {job_name!r} is already registered")
        self._handlers[job_name] = fn
        return fn

    def handler(self, name: str) -> Callable[[F], F]:
        """Decorator: `@worker.handler("send_email")`."""
        def decorate(fn: F) -> F:
            self.register(name, fn)
            return fn
        return decorate

    def workflow(self, name: str, steps: Iterable[Step | tuple[str, StepFunction]]) -> None:
        """Register a workflow: its ordered steps, each a Step(name, fn) or a (name, fn) pair.

        The definition is recorded with treadle.define_workflow when the worker starts.
        """
        self._check_not_started()
        workflow_name = _check_name(name, "workflow name")
        if workflow_name in self._workflows:
            raise InvalidArgument(f"a workflow {workflow_name!r} is already registered")
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
            raise InvalidArgument(
                f"steps must be a list of Step(name, fn) or (name, fn) pairs, not {type(steps).__name__}")
        parsed: dict[str, StepFunction] = {}
        for item in steps:
            if not isinstance(item, tuple) or len(item) != 2:
                raise InvalidArgument(f"a workflow step is a Step(name, fn) or a (name, fn) pair, not {item!r}")
            step_name = _check_name(item[0], "step name")
            if not callable(item[1]):
                raise InvalidArgument(f"step {step_name!r} of workflow {workflow_name!r} needs a callable")
            if step_name in parsed:
                raise InvalidArgument(f"workflow {workflow_name!r} repeats the step name {step_name!r}")
            parsed[step_name] = item[1]
        if not parsed:
            raise InvalidArgument(f"workflow {workflow_name!r} needs at least one step")
        self._workflows[workflow_name] = parsed

    # running and stopping
    def run(self) -> None:
        """Work until stopped. In the main thread, SIGTERM and SIGINT stop it (see the class docs)."""
        self._begin()
        self._run_until_stopped()

    def start(self, *, wait: bool = True) -> None:
        """Run in a background thread. With `wait`, return once it claims (or raise why it could not start).

        While the database cannot be reached the worker keeps trying, and so does
        `start()` with `wait`.
        """
        self._begin()
        self._thread = threading.Thread(target=self._run_in_background, name=f"treadle-worker-{self.worker_id}",
                                        daemon=True)
        self._thread.start()
        if wait:
            while not (self._ready.wait(WAIT_SLICE) or self._finished.is_set()):
                pass
            if self._background_error is not None:
                raise self._background_error

    def stop(self, *, immediate: bool = False, wait: bool = True) -> None:
        """Stop gracefully (or at once); with `wait`, return when the worker has stopped.

        From inside a handler, pass `wait=False`: the stop waits for that handler.
        """
        self._stop_requested = True
        if immediate:
            self._stop_immediate = True
        self._wake.set()
        if wait and self._used and threading.current_thread() is not self._thread:
            self._finished.wait()

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running_jobs(self) -> int:
        """Jobs claimed whose outcome is not written yet."""
        with self._lock:
            return len(self._active)

    @property
    def busy_handlers(self) -> int:
        """Claimed jobs whose handler has not returned: the slots `concurrency` counts.

        A job whose handler returned and whose outcome is being written no longer
        holds a slot, so the next claim overlaps that write.
        """
        with self._lock:
            return sum(1 for ctx in self._active if ctx._status == RUNNING)

    def _begin(self) -> None:
        with self._lock:
            if self._used:
                raise RuntimeError("this Worker has already run; create a new one")
            if not self._handlers and not self._workflows:
                raise RuntimeError("register at least one handler or workflow before running the worker")
            self._used = True

    def _check_not_started(self) -> None:
        if self._used:
            raise RuntimeError("register handlers and workflows before the worker starts")

    def _run_in_background(self) -> None:
        try:
            self._run_until_stopped()
        except BaseException as error:  # handed to start(), and logged
            self._background_error = error
            log.exception("worker %s stopped with an error", self.worker_id)

    def _run_until_stopped(self) -> None:
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for stop_signal in (signal.SIGTERM, signal.SIGINT):
                previous[stop_signal] = signal.signal(stop_signal, self._on_signal)
        try:
            self._serve()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._finished.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Flags only: this runs between two bytecodes of the main thread, which may hold any lock.
        if self._stop_requested:
            self._stop_immediate = True
        self._stop_requested = True
        self._signals.append(signum)

    def _serve(self) -> None:
        self._db.open()
        listener: Listener | None = None
        housekeeper: Housekeeper | None = None
        try:
            if not self._startup():
                return
            self._threads = HandlerThreads(self.concurrency, name=f"treadle-handler-{self.worker_id}")
            # no handler still running means no success is on its way: write at once
            self._buffer = CompletionBuffer(self._outcomes.complete_batch, delay=COMPLETION_DELAY,
                                            idle=lambda: self.busy_handlers == 0)
            listener = Listener(self._db.listen_connection, self.queues, self._wake.set)
            listener.start()
            housekeeper = Housekeeper(
                self._db, self.worker_id, lease=self.lease, heartbeat_interval=self.heartbeat_interval,
                rescue_interval=self.rescue_interval, running=self._running_contexts,
                on_rescued=self._wake.set, seen_params=self._seen_params)
            housekeeper.start()
            self._ready.set()
            log.info("worker %s started: queues %s, concurrency %d, handling %s", self.worker_id,
                     ", ".join(self.queues), self.concurrency, ", ".join(self._claim_names()))
            self._claim_loop()
            listener.stop()
            self._shutdown(housekeeper)
        finally:
            self._outcomes.abandon.set()
            if listener is not None:
                listener.stop()
            if housekeeper is not None:
                housekeeper.stop()
            if self._threads is not None:
                self._threads.close()
            self._db.close()

    def _startup(self) -> bool:
        """Check the extension, record the workflows, report the worker; False if stopped first."""
        backoff = Backoff()
        while not self._stop_requested:
            try:
                with self._db.connection() as conn:
                    check_extension(conn)
                    for name, steps in self._workflows.items():
                        conn.execute(_sql.DEFINE_WORKFLOW, {"name": name, "steps": list(steps)})
                    conn.execute(_sql.WORKER_SEEN, self._seen_params())
                return True
            except psycopg.Error as error:
                if not is_transient(error):
                    raise
                delay = backoff.next()
                log.warning("worker %s: database unavailable at start (%s); retrying in %.1f s",
                            self.worker_id, one_line(error), delay)
                self._sleep(delay)
        return False

    def _shutdown(self, housekeeper: Housekeeper) -> None:
        why = f"signal {signal.Signals(self._signals[0]).name}" if self._signals else "stop()"
        if self._stop_immediate:
            log.info("worker %s stopping at once (%s): handing back %d running jobs",
                     self.worker_id, why, self.running_jobs)
        else:
            log.info("worker %s stopping (%s): %d running jobs have %g s to finish; a second signal stops at once",
                     self.worker_id, why, self.running_jobs, self.stop_timeout)
        deadline = time.monotonic() + self.stop_timeout
        while self.running_jobs and not self._stop_immediate and time.monotonic() < deadline:
            time.sleep(min(WAIT_SLICE / 2, max(deadline - time.monotonic(), 0)))

        # hand back what has not finished; heartbeats go on meanwhile
        with self._lock:
            unfinished = [ctx for ctx in self._active if ctx._release()]
        give_up = threading.Timer(0 if self._stop_immediate else RELEASE_GRACE, self._outcomes.abandon.set)
        give_up.daemon = True
        give_up.start()
        for ctx in unfinished:
            self._outcomes.release(ctx)

        # outcomes already on their way to the database
        finish_by = time.monotonic() + FINISH_GRACE
        while time.monotonic() < finish_by and self._finishing():
            time.sleep(0.01)
        give_up.cancel()
        self._outcomes.abandon.set()
        if self._buffer is not None:
            self._buffer.close(timeout=FINISH_GRACE)
        housekeeper.stop()
        try:
            self._db.value(_sql.WORKER_STOPPED, {"worker_id": self.worker_id})
        except psycopg.Error as error:
            log.warning("worker %s: could not record its stop (%s)", self.worker_id, one_line(error))
        log.info("worker %s stopped", self.worker_id)

    # the claim loop
    def _claim_names(self) -> list[str]:
        return [*self._handlers, *(WORKFLOW_PREFIX + name for name in self._workflows)]

    def _claim_loop(self) -> None:
        names = self._claim_names()
        backoff = Backoff()
        while not self._stop_requested:
            free = self.concurrency - self.busy_handlers
            if free > 0:
                try:
                    rows = self._db.rows(_sql.CLAIM, {
                        "worker_id": self.worker_id, "queues": self.queues, "names": names,
                        "batch": free, "lease": timedelta(seconds=self.lease)})
                except psycopg.Error as error:
                    delay = backoff.next()
                    log.warning("worker %s: claim failed (%s); retrying in %.1f s",
                                self.worker_id, one_line(error), delay)
                    self._sleep(delay)
                    continue
                backoff.reset()
                self._more_waiting = len(rows) == free
                if rows:
                    self._dispatch(rows)
            self._wait_for_work()

    def _wait_for_work(self) -> None:
        """Until the poll interval passes, NOTIFY or a freed slot wakes the loop, or a stop."""
        deadline = time.monotonic() + self.poll_interval
        while not self._stop_requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._wake.wait(min(remaining, WAIT_SLICE)):
                self._wake.clear()
                return

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop_requested and (remaining := deadline - time.monotonic()) > 0:
            time.sleep(min(remaining, WAIT_SLICE))

    def _dispatch(self, rows: list[dict[str, Any]]) -> None:
        assert self._threads is not None
        runs = self._step_contexts(rows)
        for row in rows:
            ctx = JobContext(Job.from_row(row), self.worker_id, self._db, self.lease, on_lost=self._lease_lost)
            with self._lock:
                self._active.add(ctx)
            self._emit("claimed", ctx)
            self._threads.submit(partial(self._execute, ctx, runs.get(ctx.run_id)))

    def _step_contexts(self, rows: list[dict[str, Any]]) -> dict[int | None, dict[str, Any]]:
        """The run input and earlier results of the workflow steps just claimed, in one query."""
        run_ids = sorted({row["workflow_run_id"] for row in rows if row["workflow_run_id"] is not None})
        if not run_ids:
            return {}
        try:
            return {run["id"]: run for run in self._db.rows(_sql.STEP_CONTEXT, {"run_ids": run_ids})}
        except psycopg.Error as error:
            # each step then reads its own run before it starts
            log.warning("worker %s: reading workflow runs failed (%s)", self.worker_id, one_line(error))
            return {}

    # running one job
    def _execute(self, ctx: JobContext, run: dict[str, Any] | None) -> None:
        try:
            self._emit("started", ctx)
            try:
                value = self._call_handler(ctx, run)
                encoded = to_jsonb(value, "the handler's result")
            except BaseException as error:  # whatever a handler raises fails its job, not the worker
                self._handler_failed(ctx, error)
            else:
                self._handler_succeeded(ctx, encoded)
        except Exception:
            # a fault of the worker itself: free the slot; the lease lapses and a rescue returns the job
            log.exception("job %d: recording its outcome failed", ctx.job_id)
            self._done(ctx)

    def _call_handler(self, ctx: JobContext, run: dict[str, Any] | None) -> Any:
        assert self._threads is not None
        if ctx.run_id is None:
            value = self._handlers[ctx.name](ctx.args, ctx)
        else:
            workflow = ctx.name[len(WORKFLOW_PREFIX):]
            steps = self._workflows[workflow]
            fn = steps.get(ctx.step or "")
            if fn is None:
                raise LookupError(f"workflow {workflow!r} has no step {ctx.step!r} in this worker "
                                  f"(it knows {', '.join(steps)})")
            if run is None:
                found = self._outcomes.retrying(_sql.STEP_CONTEXT, {"run_ids": [ctx.run_id]},
                                                f"read workflow run {ctx.run_id}", rows=True)
                if found is UNWRITTEN or not found:
                    raise LookupError(f"workflow run {ctx.run_id} could not be read")
                run = found[0]
            value = fn(run["input"], dict(run["results"] or {}), ctx)
        if inspect.isawaitable(value):
            value = self._threads.await_in_loop(value, ctx)
        return value

    def _handler_succeeded(self, ctx: JobContext, encoded: Jsonb | None) -> None:
        outcome = ctx._begin_finishing()
        if outcome != FINISHING:
            self._settled_elsewhere(ctx, outcome)
            return
        self._emit("completing", ctx)
        assert self._buffer is not None
        try:
            self._buffer.add(Completion(ctx, encoded))
        except RuntimeError:
            log.warning("job %d finished after the worker stopped; its lease will lapse", ctx.job_id)
            self._done(ctx)
            return
        if self._more_waiting:
            self._wake.set()  # its slot is free: claim while the completion is written

    def _handler_failed(self, ctx: JobContext, error: BaseException) -> None:
        outcome = ctx._begin_finishing()
        if outcome != FINISHING:
            if outcome == COMPLETED:
                log.warning("job %d raised after complete_in completed it: %s", ctx.job_id, one_line(error))
            self._settled_elsewhere(ctx, outcome)
            return
        if isinstance(error, LeaseLost):
            ctx._mark_lost()
            self._done(ctx)
            return
        if self._on_error is not None:
            try:
                self._on_error(error, ctx.job)
            except Exception:
                log.exception("on_error raised for job %d", ctx.job_id)
        self._outcomes.fail(ctx, error)

    def _settled_elsewhere(self, ctx: JobContext, outcome: str) -> None:
        """The handler is done with a job that complete_in, a lost lease or a hand-back already settled."""
        if outcome == COMPLETED:
            state = ctx._completed_state
            self._emit("cancelled" if state == "cancelled" else "completed", ctx, state=state)
        self._done(ctx)

    def _retry_in(self, attempt: int) -> timedelta | None:
        if self._backoff is None:
            return None
        try:
            return timedelta(seconds=_args.seconds(self._backoff(attempt), "backoff(attempt)", allow_zero=True))
        except Exception:
            log.exception("backoff(%d) failed; using the default delay", attempt)
            return None

    # bookkeeping
    def _done(self, ctx: JobContext) -> None:
        with self._lock:
            self._active.discard(ctx)
        if self._more_waiting:
            self._wake.set()

    def _running_contexts(self) -> list[JobContext]:
        with self._lock:
            return [ctx for ctx in self._active if ctx._status == RUNNING and not ctx.lease_lost]

    def _finishing(self) -> bool:
        with self._lock:
            return any(ctx._status == FINISHING for ctx in self._active)

    def _seen_params(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": self.queues, "concurrency": self.concurrency, "running": self.running_jobs}

    def _lease_lost(self, ctx: JobContext) -> None:
        log.warning("job %d (%s): lease lost, another worker or a rescue took it over; "
                    "nothing from this run is written", ctx.job_id, ctx.name)
        self._emit("lease_lost", ctx)

    def _emit(self, kind: EventKind, ctx: JobContext, *, state: str | None = None, error: str | None = None) -> None:
        log.debug("job %d (%s): %s%s", ctx.job_id, ctx.name, kind, f" -> {state}" if state else "")
        if self._on_event is None:
            return
        try:
            self._on_event(WorkerEvent(kind, ctx.job, self.worker_id, state, error))
        except Exception:
            log.exception("on_event raised for %s of job %d", kind, ctx.job_id)


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise InvalidArgument(f"{what} must not be empty")
    return value


def _check_queues(queues: object) -> list[str]:
    if isinstance(queues, (str, bytes)) or not isinstance(queues, Iterable):
        raise InvalidArgument(f"queues must be a list of queue names, not {type(queues).__name__}")
    names = [_check_name(queue, "queue name") for queue in queues]
    if not names:
        raise InvalidArgument("queues must name at least one queue")
    return list(dict.fromkeys(names))
