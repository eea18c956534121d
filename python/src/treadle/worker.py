"""The worker: claims jobs, runs Python handlers and workflow steps, and finishes them.

Every state decision is the extension's: the worker asks a SQL function (claim,
heartbeat, complete_many, fail, release, rescue) and obeys its answer.

The path of a job through the modules:
- _producer.py, the claim loop, claims a batch with treadle.claim (a lease token per
  call; after a lost answer, treadle.claimed says what it took) and makes a RunState
  (_run_state.py) for each job, which the worker tracks until it is settled;
- _executor.py decodes the job alone, finds its handler or step (_registry.py)
  and calls it with a JobContext (_context.py) on a handler thread, or an `async def`
  as a task on the worker's event loop (_handler_threads.py), `concurrency` at a time;
- _completer.py writes the outcome: successes batched into treadle.complete_and_claim,
  which claims the next jobs in the same statement (the producer is its ClaimAlong), failures with
  treadle.fail (how: _retry.py, from the handler's policy), snoozes with
  treadle.snooze, hand-backs at shutdown with treadle.release;
- meanwhile _housekeeping.py heartbeats all leases in one statement and rescues
  expired ones, and _notifier.py wakes the claim loop when NOTIFY says work arrived.

This module keeps the lifecycle: the options (checked once, _options.py),
registration, start and stop, signals, startup and shutdown, and the jobs claimed
and not yet settled. The producer, the executor and the completer each reach the
worker through one small protocol (ProducerHost, ExecutorHost, CompleterHost),
all three implemented by _Host here.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from . import _args, _dsn, _sql
from ._compat import read_extension_version
from ._completer import Completer
from ._context import JobContext
from ._events import EventKind, WorkerEvent
from ._executor import DeferredLoader, Executor
from ._handler_threads import HandlerThreads
from ._housekeeping import Housekeeper
from ._notifier import Notifier, WakeOnNotify
from ._options import Duration, WorkerOptions
from ._pool import WorkerPool, connect_direct
from ._producer import WAIT_SLICE, Producer, sleep_until_stopped
from ._registry import Child, Compensation, Handler, Registry, Sleep, Step, StepFunction, Wait, handler_policy
from ._retry import Backoff, FailureWrite, failure_write, is_transient, one_line
from ._run_state import RunState, RunStatus
from .errors import InvalidArgument
from .models import Job

if TYPE_CHECKING:
    from .metrics import MetricsServer, WorkerMetrics

__all__ = ["Handler", "JobContext", "Sleep", "Step", "StepFunction", "Wait", "Worker", "WorkerEvent"]

log = logging.getLogger("treadle.worker")

F = TypeVar("F", bound=Callable[..., Any])

COMPLETION_DELAY = 0.005  # how long a success waits to be finished together with others
RELEASE_GRACE = 5.0  # how long a graceful stop retries hand-backs while the database is away
FINISH_GRACE = 2.0  # how long a stop waits for outcomes already being written


class Worker:
    """Claims jobs from `queues` and runs the handlers and workflows registered on it.

    `dsn_or_pool` is a connection string (the worker then owns a small pool) or a
    psycopg_pool.ConnectionPool the application already runs. Durations are seconds
    or timedeltas: `poll_interval` (claim at least this often; LISTEN/NOTIFY wakes
    it sooner, and a job that ends has it claim at once: a write of successes claims
    in its own statement), `lease` (how long a claim holds a job without a heartbeat),
    `heartbeat_interval` (shorter than the lease), `rescue_interval` (how often to
    return the jobs of dead workers), `retention_interval` (how often to delete
    finished work past its retention with treadle.apply_retention and move finished
    jobs to treadle.job_history with treadle.archive, at most `retention_batch` jobs
    per transaction, sooner while there is more; None turns it off, as where pg_cron
    does it), `stop_timeout`. `claim_ahead`: how many jobs
    beyond its free slots the worker may hold, claimed while handlers run, so that
    a handler finds its next job at hand (None: as many as `concurrency` while
    handlers take under 50 ms on average, three times as many under 1 ms; 0: never). `backoff(attempt)` gives the
    delay in seconds before a failed attempt runs again (the SQL default, 2^attempt
    seconds with jitter, when None); a handler's own `backoff` and a job's own
    (enqueue) come first: docs/retries.md. `on_error(exc, job)` hears every
    exception a handler raised (not a Snooze);
    `on_event(WorkerEvent)` hears claimed, started, completing, completed, failed,
    cancelled, lease_lost, released and snoozed.

    Metrics: with `metrics_port` the worker serves Prometheus metrics of what it
    does at http://`metrics_host`:`metrics_port`/metrics while it runs (port 0: any
    free port, which the log names), and with `metrics_database` the database's
    metrics too (docs/metrics.md). They need the `metrics` extra
    (pip install 'treadle[metrics]'); `serve_metrics()` sets the same before a start.

    Wake-ups: with `listen` (the default) a connection of its own LISTENs for new
    work, on `listen_dsn` when given, else on the worker's own server when it is
    reached directly; through a pooler or proxy the worker polls (a LISTEN there
    would land on a server connection other clients share). `listen=False` polls
    only (work its own jobs make, such as a job a handler enqueued, is claimed when
    they end either way). Prepared statements: with `prepared_statements=None` (the default) each
    pooled connection prepares the statements it repeats when it reaches the server
    itself (its backend process id is the server's), and not through a pooler (which
    answers with an id of its own: in transaction mode it would lose them); True
    prepares on every connection (a pooler that keeps them), False never.

    Handlers are called as `fn(args, ctx)` in a pool of `concurrency` threads
    (`async def` handlers run as tasks on one event loop thread; while handlers take
    under a millisecond on average, the first jobs claimed with a write of finished ones
    (as many as take about a millisecond together) run one after another on the thread
    that wrote, the others in the pool, and one there that takes over 10 ms
    hands the others on); their JSON return value
    becomes the job's result. Workflow steps are called as `fn(input, ctx)`, the earlier
    steps' results on `ctx.results`.

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
        retention_interval: Duration | None = 60,
        retention_batch: int = 1000,
        stop_timeout: Duration = 30,
        backoff: Callable[[int], Duration] | None = None,
        on_error: Callable[[BaseException, Job], None] | None = None,
        on_event: Callable[[WorkerEvent], None] | None = None,
        worker_id: str | None = None,
        listen: bool = True,
        listen_dsn: str | None = None,
        prepared_statements: bool | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        metrics_database: bool = False,
        claim_ahead: int | None = None,
    ) -> None:
        self._options = options = WorkerOptions.of(
            queues=queues,
            concurrency=concurrency,
            poll_interval=poll_interval,
            lease=lease,
            heartbeat_interval=heartbeat_interval,
            rescue_interval=rescue_interval,
            retention_interval=retention_interval,
            retention_batch=retention_batch,
            stop_timeout=stop_timeout,
            backoff=backoff,
            on_error=on_error,
            on_event=on_event,
            worker_id=worker_id,
            listen=listen,
            listen_dsn=listen_dsn,
            prepared_statements=prepared_statements,
            claim_ahead=claim_ahead,
        )
        self._pool = WorkerPool(
            dsn_or_pool,
            f"treadle-worker:{options.worker_id}",
            min(options.concurrency, 16) + 3,
            prepared_statements=options.prepared_statements,
        )
        self._pool.redactor = _dsn.Redactor(self._pool.conninfo, options.listen_dsn)

        self._registry = Registry()
        self._active: set[RunState] = set()  # claimed and not yet settled, keyed by run, not job id
        self._housekeeper: Housekeeper | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._finished = threading.Event()
        self._stop_requested = False
        self._stop_immediate = False
        self._signals: list[int] = []
        self._used = False
        self._thread: threading.Thread | None = None
        self._background_error: BaseException | None = None
        self._threads: HandlerThreads | None = None
        self._producer: Producer | None = None
        self._completer: Completer | None = None
        self._executor: Executor | None = None
        self._deferred: DeferredLoader | None = None  # made at startup, from a connection of the worker's
        self._host = _Host(self)
        self._metrics: WorkerMetrics | None = None
        self._metrics_address: tuple[str, int] | None = None
        self._metrics_database = False
        self._metrics_top_queues = 50
        if metrics_port is not None:
            self.serve_metrics(metrics_port, host=metrics_host, database=metrics_database)

    # the options, as given (checked: WorkerOptions)
    @property
    def queues(self) -> list[str]:
        return list(self._options.queues)

    @property
    def concurrency(self) -> int:
        return self._options.concurrency

    @property
    def claim_ahead(self) -> int:
        return self._options.claim_ahead

    @property
    def poll_interval(self) -> float:
        return self._options.poll_interval

    @property
    def lease(self) -> float:
        return self._options.lease

    @property
    def heartbeat_interval(self) -> float:
        return self._options.heartbeat_interval

    @property
    def rescue_interval(self) -> float:
        return self._options.rescue_interval

    @property
    def retention_interval(self) -> float | None:
        return self._options.retention_interval

    @property
    def retention_batch(self) -> int:
        return self._options.retention_batch

    @property
    def stop_timeout(self) -> float:
        return self._options.stop_timeout

    @property
    def worker_id(self) -> str:
        return self._options.worker_id

    # registration
    @overload
    def register(self, name: F) -> F: ...
    @overload
    def register(
        self,
        name: str,
        *,
        max_attempts: int | None = None,
        backoff: Callable[[int], Duration] | None = None,
        timeout: Duration | None = None,
    ) -> Callable[[F], F]: ...
    @overload
    def register(
        self,
        name: str,
        fn: F,
        *,
        max_attempts: int | None = None,
        backoff: Callable[[int], Duration] | None = None,
        timeout: Duration | None = None,
    ) -> F: ...
    def register(
        self,
        name: str | Callable[..., Any],
        fn: Callable[..., Any] | None = None,
        *,
        max_attempts: int | None = None,
        backoff: Callable[[int], Duration] | None = None,
        timeout: Duration | None = None,
    ) -> Any:
        """Register `fn(args, ctx)` for jobs called `name`; returns `fn`.

        Also a decorator: `@worker.register("name")`, or bare `@worker.register`
        (the function's own name is the job name). The handler's policy
        (docs/retries.md): its jobs are discarded once `max_attempts` attempts
        failed (or their own max_attempts, whichever is lower); `backoff(attempt)`
        gives the seconds before the next attempt (instead of the Worker's); an
        attempt that runs longer than `timeout` is cancelled and fails with
        JobTimeout. A job enqueued with its own backoff or timeout keeps it.
        """
        if fn is None:
            if callable(name):
                return self.register(name.__name__, name)
            return lambda f: self.register(name, f, max_attempts=max_attempts, backoff=backoff, timeout=timeout)
        self._check_not_started()
        self._registry.add_handler(name, fn, handler_policy(max_attempts, backoff, timeout))
        return fn

    def handler(self, name: str) -> Callable[[F], F]:
        """Decorator: `@worker.handler("send_email")`, the same as `@worker.register("send_email")`."""

        def decorate(fn: F) -> F:
            self.register(name, fn)
            return fn

        return decorate

    def workflow(
        self,
        name: str,
        steps: Iterable[Step | Sleep | Wait | Child | Compensation | tuple[str, StepFunction | Callable[..., Any]]],
        *,
        max_attempts: int | None = None,
        backoff: Callable[[int], Duration] | None = None,
        timeout: Duration | None = None,
    ) -> None:
        """Register a workflow: its steps, each a Step(name, fn, after=...) or a (name, fn) pair.

        Without `after` the steps run in order, each after the one before it. With
        `Step("report", fn, after=["extract_a", "extract_b"])` the steps form a graph: a
        step runs once the steps it names completed, and receives their results (and those
        of the steps before them); a step without `after` starts with the run. A
        `Sleep(name, timedelta)` step has no handler: the run waits that long in the
        database (or, with `Sleep(name, until=...)`, until a datetime or the time the
        run's input holds under a key: `until={"input": key}`). A `Wait(name, signal,
        timeout=None)` step has no handler either: it completes with the payload of the
        signal `signal` sent to the run (treadle.signal). A `Child(name, workflow)` step
        has no handler either: it starts a run of `workflow` and completes with its results. A
        `Compensation(name, fn, undoes=step)` runs only when the run fails for good, to
        undo that step. A step is called as `fn(input, ctx)` with the earlier results on
        `ctx.results`; a `fn(input, results, ctx)` (before 0.4.0) still is, with a
        DeprecationWarning here. The worker claims only the steps it has, so during a
        rolling deploy a step of another definition waits for a worker that has it.
        The definition is recorded with treadle.define_workflow when the worker starts
        (each change counts a new version; a run keeps the definition it started with).
        `max_attempts`, `backoff` and `timeout` are a policy for each of its steps, as
        `register`'s are for a handler's jobs; a Step's own `queue`, `priority`,
        `max_attempts`, `timeout` and `backoff` are kept in the database with the
        definition and set on its jobs (a worker claims a step in another queue only
        when it works that queue).
        """
        self._check_not_started()
        self._registry.add_workflow(name, steps, handler_policy(max_attempts, backoff, timeout))

    def serve_metrics(
        self, port: int, *, host: str = "127.0.0.1", database: bool = False, top_queues: int = 50
    ) -> None:
        """Serve Prometheus metrics at http://host:port/metrics while the worker runs (before it starts).

        `database` adds the database's metrics, read through the worker's pool at each
        scrape, naming the `top_queues` busiest queues and summing the rest.
        ImportError, naming the `pip install` that gives it, without prometheus_client.
        """
        self._check_not_started()
        port = _args.integer(port, "metrics_port", (0, 65535))
        if not (isinstance(host, str) and host.strip()):
            raise InvalidArgument("metrics_host must be a host name or address")
        if not isinstance(database, bool):
            raise InvalidArgument(f"metrics_database must be True or False, not {type(database).__name__}")
        self._metrics_top_queues = _args.integer(top_queues, "top_queues", (1, 10_000))
        from .metrics import WorkerMetrics

        self._metrics = WorkerMetrics()
        self._metrics.track_slots(lambda: self.busy_handlers, self.concurrency)
        self._metrics_address = (host, port)
        self._metrics_database = database

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
        self._thread = threading.Thread(
            target=self._run_in_background, name=f"treadle-worker-{self.worker_id}", daemon=True
        )
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
        """Claimed jobs whose handler runs: the slots `concurrency` counts.

        A job whose handler returned and whose outcome is being written no longer
        holds a slot, so the next claim overlaps that write; nor does a job claimed
        ahead whose handler has not started.
        """
        with self._lock:
            return sum(1 for run in self._active if run.busy)

    def _begin(self) -> None:
        with self._lock:
            if self._used:
                raise RuntimeError("this Worker has already run; create a new one")
            if not self._registry:
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
        self._pool.open()
        notifier: WakeOnNotify | None = None
        housekeeper: Housekeeper | None = None
        metrics_server: MetricsServer | None = None
        try:
            if not self._startup():
                return
            metrics_server = self._start_metrics_server()
            self._threads = HandlerThreads(self.concurrency, name=f"treadle-handler-{self.worker_id}")
            producer = Producer(self._pool, self._options, self._registry.claim_names(), self._host, self._wake)
            self._completer = Completer(
                self._pool,
                self.worker_id,
                self._host,
                delay=COMPLETION_DELAY,
                flush_at=max(1, self.concurrency // 2),
                claim_along=producer,
                # one writes; a writer is handed off from only while it runs a slow handler, which holds a slot
                writers=self.concurrency + 1,
            )
            self._executor = Executor(
                self._registry,
                self._threads,
                self._completer,
                self._pool,
                self._host,
                worker_id=self.worker_id,
                lease=self.lease,
                concurrency=self.concurrency,
            )
            assert self._deferred is not None
            producer.bind(self._completer, self._executor, self._deferred)
            self._producer = producer
            if self._options.listen:
                listener = self._notifier()
                try:
                    # LISTEN before the first claim: a cancel of a job this worker runs is heard
                    listener.open()
                except psycopg.Error as error:  # the notifier thread connects again, with backoff
                    log.info("LISTEN unavailable (%s); polling only until it connects", one_line(error))
                notifier = WakeOnNotify(listener, self.queues, self._wake.set, on_cancel=self._cancel_announced)
                notifier.start()
            housekeeper = self._housekeeper = Housekeeper(
                self._pool,
                self.worker_id,
                lease=self.lease,
                heartbeat_interval=self.heartbeat_interval,
                rescue_interval=self.rescue_interval,
                retention_interval=self.retention_interval,
                retention_batch=self.retention_batch,
                running=self._running,
                on_rescued=self._rescued,
                seen_params=self._seen_params,
            )
            housekeeper.start()
            self._ready.set()
            log.info(
                "worker %s started: queues %s, concurrency %d, handling %s",
                self.worker_id,
                ", ".join(self.queues),
                self.concurrency,
                ", ".join(self._registry.claim_names()),
            )
            producer.run()
            if notifier is not None:
                notifier.stop()
            self._shutdown(housekeeper)
        finally:
            if self._completer is not None:
                self._completer.abandon.set()
            if notifier is not None:
                notifier.stop()
            if housekeeper is not None:
                housekeeper.stop()
            if self._executor is not None:
                self._executor.close()
            if self._threads is not None:
                self._threads.close()
            if metrics_server is not None:
                metrics_server.close()
            self._pool.close()

    def _start_metrics_server(self) -> MetricsServer | None:
        if self._metrics is None or self._metrics_address is None:
            return None
        from .metrics import DatabaseCollector, MetricsServer

        if self._metrics_database:
            self._metrics.registry.register(
                DatabaseCollector(self._pool.connection, top_queues=self._metrics_top_queues)
            )
        host, port = self._metrics_address
        try:
            server = MetricsServer(self._metrics.registry, port, host)
        except OSError as error:
            raise InvalidArgument(f"cannot serve metrics on {host}:{port}: {error.strerror or error}") from error
        log.info("worker %s serving metrics at http://%s:%d/metrics", self.worker_id, host, server.port)
        return server

    def _notifier(self) -> Notifier:
        listen_dsn = self._options.listen_dsn
        conninfo = listen_dsn or self._pool.conninfo
        name = self._pool.application_name
        return Notifier(
            lambda: connect_direct(conninfo, name),
            [_sql.LISTEN_CANCEL, _sql.LISTEN_JOBS],  # the listener's last query: LISTEN treadle_jobs
            log,
            trusted=listen_dsn is not None,
        )

    def _cancel_announced(self, payload: str) -> None:
        """A cancel was requested of job `payload`: if this worker runs it, heartbeat it now (the
        answer 'cancel' sets its handler's ctx.cancelled), not at its next beat."""
        try:
            job_id = int(payload)
        except ValueError:
            return
        with self._lock:
            held = any(run.job_id == job_id for run in self._active)
        housekeeper = self._housekeeper
        if held and housekeeper is not None:
            housekeeper.heartbeat_now(job_id)

    def _startup(self) -> bool:
        """Check the extension, record the workflows, report the worker; False if stopped first."""
        backoff = Backoff()
        while not self._stop_requested:
            try:
                with self._pool.connection() as conn:
                    read_extension_version(conn)
                    self._deferred = DeferredLoader(conn)
                    for name in self._registry.workflows:
                        definition = self._registry.definition(name)
                        after, sleeps, maps = definition["after"], definition["sleeps"], definition["maps"]
                        waits = definition["waits"]
                        conn.execute(
                            _sql.DEFINE_WORKFLOW,
                            {
                                **definition,
                                "after": None if after is None else Jsonb(after),
                                "sleeps": None if sleeps is None else Jsonb(sleeps),
                                "maps": None if maps is None else Jsonb(maps),
                                "waits": None if waits is None else Jsonb(waits),
                                "children": None if definition["children"] is None else Jsonb(definition["children"]),
                                "compensations": (
                                    None if definition["compensations"] is None else Jsonb(definition["compensations"])
                                ),
                                "step_options": (
                                    None if definition["step_options"] is None else Jsonb(definition["step_options"])
                                ),
                            },
                        )
                    conn.execute(_sql.WORKER_SEEN, self._seen_params())
                return True
            except psycopg.Error as error:
                if not is_transient(error):
                    raise
                delay = backoff.next()
                log.warning(
                    "worker %s: database unavailable at start (%s); retrying in %.1f s",
                    self.worker_id,
                    one_line(error),
                    delay,
                )
                sleep_until_stopped(self._host, delay)
        return False

    def _shutdown(self, housekeeper: Housekeeper) -> None:
        assert self._completer is not None
        completer = self._completer
        why = f"signal {signal.Signals(self._signals[0]).name}" if self._signals else "stop()"
        if self._stop_immediate:
            log.info(
                "worker %s stopping at once (%s): handing back %d running jobs", self.worker_id, why, self.running_jobs
            )
        else:
            log.info(
                "worker %s stopping (%s): %d running jobs have %g s to finish; a second signal stops at once",
                self.worker_id,
                why,
                self.running_jobs,
                self.stop_timeout,
            )
        # jobs claimed ahead whose handler has not started go back at once
        with self._lock:
            waiting = [run for run in self._active if run.release(only_unstarted=True)]
        for run in waiting:
            completer.release(run)
        deadline = time.monotonic() + self.stop_timeout
        while self.running_jobs and not self._stop_immediate and time.monotonic() < deadline:
            time.sleep(min(WAIT_SLICE / 2, max(deadline - time.monotonic(), 0)))

        # hand back what has not finished; heartbeats go on meanwhile
        with self._lock:
            unfinished = [run for run in self._active if run.release()]
        give_up = threading.Timer(0 if self._stop_immediate else RELEASE_GRACE, completer.abandon.set)
        give_up.daemon = True
        give_up.start()
        for run in unfinished:
            completer.release(run)

        # outcomes already on their way to the database
        finish_by = time.monotonic() + FINISH_GRACE
        while time.monotonic() < finish_by and self._finishing():
            time.sleep(0.01)
        give_up.cancel()
        completer.abandon.set()
        completer.close(timeout=FINISH_GRACE)
        housekeeper.stop()
        try:
            self._pool.value(_sql.WORKER_STOPPED, {"worker_id": self.worker_id})
        except psycopg.Error as error:
            log.warning("worker %s: could not record its stop (%s)", self.worker_id, one_line(error))
        log.info("worker %s stopped", self.worker_id)

    # what the housekeeper asks
    def _running(self) -> list[RunState]:
        with self._lock:
            return [run for run in self._active if run.needs_heartbeat]

    def _finishing(self) -> bool:
        with self._lock:
            return any(run.status is RunStatus.FINISHING for run in self._active)

    def _seen_params(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "concurrency": self.concurrency,
            "running": self.running_jobs,
            "names": self._registry.claim_names() or None,
        }

    def _rescued(self, count: int) -> None:
        if self._metrics is not None:
            self._metrics.rescued(count)
        self._wake.set()  # rescued jobs are due at once


class _Host:
    """The worker's side of the producer's, executor's and completer's protocols."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    @property
    def stopping(self) -> bool:
        return self._worker._stop_requested

    def holding(self) -> int:
        worker = self._worker
        with worker._lock:
            return sum(1 for run in worker._active if run.holds_slot)

    def track(self, run: RunState) -> None:
        worker = self._worker
        with worker._lock:
            worker._active.add(run)

    def done(self, run: RunState) -> None:
        worker = self._worker
        with worker._lock:
            worker._active.discard(run)
        if worker._producer is not None:
            worker._producer.settled()

    def slot_freed(self) -> None:
        if self._worker._producer is not None:
            self._worker._producer.slot_freed()

    def handler_ran(self, seconds: float) -> None:
        if self._worker._producer is not None:
            self._worker._producer.handler_ran(seconds)

    def idle(self) -> bool:
        executor = self._worker._executor
        return executor is None or executor.idle()

    def failure_write(self, run: RunState, error: BaseException) -> FailureWrite:
        worker = self._worker
        return failure_write(error, run.job, worker._registry.policy(run.name), worker._options.backoff)

    def on_error(self, error: BaseException, job: Job) -> None:
        callback = self._worker._options.on_error
        if callback is not None:
            callback(error, job)

    def lease_lost(self, run: RunState) -> None:
        log.warning(
            "job %d (%s): lease lost, another worker or a rescue took it over; nothing from this run is written",
            run.job_id,
            run.name,
        )
        self.emit("lease_lost", run)

    def emit(self, kind: EventKind, run: RunState, *, state: str | None = None, error: str | None = None) -> None:
        # four events a job: without a listener, and unless debug logging is on, nothing is built
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job %d (%s): %s%s", run.job_id, run.name, kind, f" -> {state}" if state else "")
        on_event = self._worker._options.on_event
        metrics = self._worker._metrics
        if on_event is None and metrics is None:
            return
        event = WorkerEvent(kind, run.job, self._worker.worker_id, state, error)
        if metrics is not None:
            metrics.observe(event)
        if on_event is None:
            return
        try:
            on_event(event)
        except BaseException:  # a callback's failure, whatever it is, stays with the callback
            log.exception("on_event raised for %s of job %d", kind, run.job_id)
