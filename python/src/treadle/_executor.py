"""Running one claimed job: call its handler or workflow step, then hand the outcome to the completer.

Whatever the job holds or its handler does, the job ends with an outcome and the
worker goes on: a payload that cannot be decoded, a handler that raises anything
(BaseException included), and a result that cannot be encoded each fail that job
alone, with an error that says why.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import psycopg
from psycopg.adapt import Transformer

from . import _otel, _sql
from ._completer import Completer, Unwritten
from ._context import JobContext
from ._deadlines import Deadline
from ._handler_threads import HandlerThreads
from ._json import from_json, to_jsonb
from ._pool import WorkerPool
from ._registry import Registry
from ._retry import attempt_timeout, one_line
from ._run_state import RunState, RunStatus
from .errors import Discard, InvalidArgument, JobCancelled, JobTimeout, LeaseLost, Snooze, UndecodablePayload
from .models import DEFERRED_KEY, Job

if TYPE_CHECKING:
    from ._events import EventKind

log = logging.getLogger("treadle.worker")

# A job run inline (Executor.run_in_turn) that has not returned after this long is slow: the
# jobs queued behind it go to handler threads, and another thread takes over the writes.
# The check runs this often while jobs run inline, so they wait at most about twice this.
INLINE_PATIENCE = 0.01


class Claimed(NamedTuple):
    """A job as the claim returned it: decoded, or with the reason it could not be.

    A tuple, not a frozen dataclass: one is made for every job claimed, and a frozen
    dataclass's __init__ costs three times as much.
    """

    job: Job
    undecodable: UndecodablePayload | None = None


# where a claimed row (_sql._claimed_columns: CLAIMED_EAGER's columns, then the others' record) holds what
# is decoded here
_ARGS, _META = (_sql.CLAIMED_EAGER.index(column) for column in ("args", "meta"))
STEP_RUN = _sql.CLAIMED_EAGER.index("workflow_run_id")
STEP_NAME = _sql.CLAIMED_EAGER.index("step")
_DEFERRED_NAMES = tuple(name for name, _ in _sql.CLAIMED_DEFERRED)
assert {field.name for field in fields(Job)} == {*_sql.CLAIMED_EAGER, *_DEFERRED_NAMES}, "a claimed row has every field"
_new = object.__new__
_decode = json.JSONDecoder().decode  # json.loads without its checks of the argument's type, for a str


class DeferredLoader:
    """Takes a claimed job's deferred fields apart: the record split as psycopg splits one, each
    field loaded by the loader of its type that a worker connection (`conn`) has, so that they
    are what a column of that type would have been."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._encoding = conn.info.encoding
        transformer = Transformer.from_context(conn)
        transformer.set_loader_types(
            [_type_oid(kind, conn) for _, kind in _sql.CLAIMED_DEFERRED], psycopg.pq.Format.TEXT
        )
        self._transformer = transformer

    def load(self, record: str) -> dict[str, Any]:
        loaded = self._transformer.load_sequence(_split(record.encode(self._encoding)))
        by_name = dict(zip(_DEFERRED_NAMES, loaded, strict=True))
        by_name["result"] = _or_none(by_name["result"])
        by_name["errors"] = _or_none(by_name["errors"])
        return by_name


class _Deferred:
    """One claimed job's deferred fields (models.DeferredFields)."""

    __slots__ = ("loader", "record")

    def __init__(self, loader: DeferredLoader, record: str) -> None:
        self.loader = loader
        self.record = record

    def load(self) -> dict[str, Any]:
        return self.loader.load(self.record)


def _type_oid(kind: str, conn: psycopg.Connection[Any]) -> int:
    info = conn.adapters.types.get(kind.removesuffix("[]"))
    if info is None:  # pragma: no cover - every type named in CLAIMED_DEFERRED is built in
        raise LookupError(f"no type {kind}")
    return info.array_oid if kind.endswith("[]") else info.oid


# a record's text split into its fields (psycopg.types.composite does the same for a record)
_FIELD = re.compile(
    rb"""(?x)
      (,)                       # an empty field: null
    | " ((?: [^"] | "")*) " ,?  # a quoted one, its quotes and backslashes doubled
    | ([^",)]+) ,?              # an unquoted one
    """
)
_DOUBLED = re.compile(rb'(["\\])\1')


def _split(record: bytes) -> list[bytes | None]:
    values: list[bytes | None] = []
    match = None
    for match in _FIELD.finditer(record, 1, len(record) - 1):
        if match.group(1):
            values.append(None)
        elif match.group(2) is not None:
            values.append(_DOUBLED.sub(rb"\1", match.group(2)))
        else:
            values.append(match.group(3))
    if match is not None and match.group().endswith(b","):
        values.append(None)  # the last field is null
    return values


def decode_claimed(row: Sequence[Any], deferred: DeferredLoader) -> Claimed:
    """Decode one claimed row's args and meta (the claim sends them as text); never raises for a payload.

    The row holds _sql.CLAIMED_EAGER's columns in their order, then the other fields' record,
    which becomes the Job's deferred fields (models.DEFERRED_KEY), taken apart when one is read.
    """
    values = list(row)
    record = values.pop()
    problem: UndecodablePayload | None = None
    args = values[_ARGS]
    if args is not None:
        try:
            values[_ARGS] = _decode(args)
        except (RecursionError, ValueError):
            values[_ARGS], problem = None, _undecodable(args, f"job {values[0]}'s args")
    if values[_META] is not None:
        values[_META] = _or_none(values[_META])
    # a frozen dataclass's __init__ sets each field through object.__setattr__: filling the
    # instance's dict at once makes the same object (Job has no __post_init__)
    job: Job = _new(Job)
    state = job.__dict__
    state.update(zip(_sql.CLAIMED_EAGER, values, strict=True))
    state[DEFERRED_KEY] = _Deferred(deferred, record)
    return Claimed(job, problem)


def _undecodable(text: str, what: str) -> UndecodablePayload:
    """Why `text` cannot be decoded, as from_json says it (its message made only for a payload that fails)."""
    try:
        from_json(text, what)
    except UndecodablePayload as error:
        return error
    return UndecodablePayload(f"{what} could not be decoded")  # pragma: no cover - from_json failed just before


def _or_none(text: str | None) -> Any:
    # a claimed job's earlier result and errors are for show only: one that cannot be decoded is dropped
    if text is None:
        return None
    if text == "[]":  # the errors of a job that never failed: most jobs
        return []
    try:
        return from_json(text, "a column")
    except UndecodablePayload:
        return None


class _InlineRun:
    """Jobs one thread runs one after another (Executor.run_in_turn), as the watch sees them."""

    __slots__ = ("calls", "lock", "since", "slow", "thread")

    def __init__(self, calls: list[tuple[RunState, Claimed, dict[str, Any] | None]]) -> None:
        self.calls = collections.deque(calls)  # not yet begun
        self.lock = threading.Lock()
        self.since: float | None = None  # when the job running now began (time.monotonic()), or None
        self.slow = False  # found slow: what was queued went to handler threads
        self.thread = threading.get_ident()


class ExecutorHost(Protocol):
    """What the executor needs from the worker."""

    def emit(self, kind: EventKind, run: RunState, *, state: str | None = None, error: str | None = None) -> None:
        """Report what became of a job (WorkerEvent)."""
        ...

    def done(self, run: RunState) -> None:
        """The job is settled (or given up on): the worker stops answering for it."""
        ...

    def on_error(self, error: BaseException, job: Job) -> None:
        """A handler raised `error` (not a Snooze): the Worker's on_error hears it."""
        ...

    def slot_freed(self) -> None:
        """A handler returned and its success is queued: its slot may take the next job."""
        ...

    def handler_ran(self, seconds: float) -> None:
        """A handler ran for `seconds` (the claim loop keeps an average)."""
        ...


class Executor:
    """Runs claimed jobs, on the handler threads or (async ones) on the event loop, and settles each one."""

    def __init__(
        self,
        registry: Registry,
        threads: HandlerThreads,
        completer: Completer,
        pool: WorkerPool,
        host: ExecutorHost,
        *,
        worker_id: str,
        lease: float,
        concurrency: int,
    ) -> None:
        self._registry = registry
        self._threads = threads
        self._completer = completer
        self._pool = pool
        self._worker_id = worker_id
        self._lease = timedelta(seconds=lease)  # made once, not once a job (JobContext takes it)
        self._host = host
        # whether a handler (or step function) is an `async def`, by the function: asked once a job
        self._coroutine_fns: dict[Callable[..., Any], bool] = {}
        self._lock = threading.Lock()
        self._handlers_running = 0
        # Handlers running, sync or async, and settling their jobs: at most `concurrency`,
        # as when every handler held a thread. Sync ones wait on the condition, in their
        # thread; async ones wait in the deque, and a freed slot starts the next.
        self._concurrency = concurrency
        self._slots = threading.Condition()
        self._in_slots = 0
        self._slot_waiters = 0  # handler threads waiting in _take_slot: a freed slot notifies only then
        self._waiting_tasks: collections.deque[Coroutine[Any, Any, None]] = collections.deque()
        self._traced = False  # whether an attempt runs in a span (_otel), asked once per claimed batch
        # jobs running inline, and the watch over them (armed while some run: _watch_inline)
        self._inline: list[_InlineRun] = []
        self._inline_lock = threading.Lock()
        self._inline_seen = False  # some ran since the watch last looked
        self._inline_watched = False

    def claimed_batch(self) -> None:
        """A claimed batch is about to be submitted: whether its attempts are traced is asked once, here."""
        self._traced = _otel.tracing()

    def idle(self) -> bool:
        """No handler is running (cheaper than counting the worker's jobs)."""
        return self._handlers_running == 0

    def submit(
        self,
        run: RunState,
        claimed: Claimed,
        step_run: dict[str, Any] | None,
        inline: list[tuple[RunState, Claimed, dict[str, Any] | None]] | None = None,
    ) -> None:
        """Run the job: a coroutine handler as a task on the event loop, any other on a handler
        thread, or (given `inline`) appended there for `run_in_turn`."""
        if claimed.undecodable is None and self._is_coroutine(run, step_run):
            self._start_async(self.execute_async(run, step_run))
        elif inline is not None:
            inline.append((run, claimed, step_run))
        else:
            self._threads.submit(lambda: self.execute(run, claimed, step_run))

    def run_in_turn(self, calls: list[tuple[RunState, Claimed, dict[str, Any] | None]]) -> None:
        """Run these jobs (plain-function handlers, which have been quick) on this thread, one after another.

        The completer's writer runs the jobs its write claimed this way: handing each to a
        handler thread, and its success back, costs more than a quick handler. Each takes
        a slot as on a handler thread (one that finds none free goes to a handler thread).
        When one runs longer than INLINE_PATIENCE, the watch hands the jobs queued behind
        it to handler threads and has another thread take over the completer's writes
        (Completer.hand_off): a handler that turns out slow holds neither.
        """
        batch = _InlineRun(calls)
        with self._inline_lock:
            self._inline.append(batch)
            self._inline_seen = True
            if not self._inline_watched:
                self._inline_watched = True
                self._threads.deadlines.call_later(INLINE_PATIENCE, self._watch_inline)
        try:
            while True:
                with batch.lock:
                    if not batch.calls:
                        batch.since = None
                        break
                    run, claimed, step_run = batch.calls.popleft()
                    batch.since = time.monotonic()
                if not self._try_take_slot():
                    self._threads.submit(functools.partial(self.execute, run, claimed, step_run))
                    continue
                try:
                    self._execute(run, claimed, step_run)
                finally:
                    self._give_slot()
        finally:
            with batch.lock:
                rest, batch.since = list(batch.calls), None
                batch.calls.clear()
            with self._inline_lock:
                self._inline.remove(batch)
            for call in rest:  # only after a fault of the worker's own: each still runs
                self._threads.submit(functools.partial(self.execute, *call))

    def _watch_inline(self) -> None:
        """From the deadline thread, every INLINE_PATIENCE while jobs run inline: hand on what
        waits behind a slow one."""
        now = time.monotonic()
        with self._inline_lock:
            runs = list(self._inline)
            # (a run already found slow keeps nothing to watch: its thread handed everything on)
            again = self._inline_seen or any(not batch.slow for batch in runs)
            self._inline_seen = False
            self._inline_watched = again
            if again:
                self._threads.deadlines.call_later(INLINE_PATIENCE, self._watch_inline)
        for batch in runs:
            with batch.lock:
                if batch.slow or batch.since is None or now - batch.since < INLINE_PATIENCE:
                    continue
                batch.slow = True
                rest = list(batch.calls)
                batch.calls.clear()
            for call in rest:
                self._threads.submit(functools.partial(self.execute, *call))
            self._completer.hand_off(batch.thread)

    def close(self) -> None:
        """The async jobs still waiting for a slot never start (the worker handed them back)."""
        with self._slots:
            waiting, self._waiting_tasks = list(self._waiting_tasks), collections.deque()
        for coroutine in waiting:
            coroutine.close()

    def _start_async(self, coroutine: Coroutine[Any, Any, None]) -> None:
        with self._slots:
            if self._in_slots >= self._concurrency:
                self._waiting_tasks.append(coroutine)
                return
            self._in_slots += 1
        self._threads.start_task(coroutine)

    def _try_take_slot(self) -> bool:
        with self._slots:
            if self._in_slots >= self._concurrency:
                return False
            self._in_slots += 1
            return True

    def _take_slot(self) -> None:
        with self._slots:
            while self._in_slots >= self._concurrency:
                self._slot_waiters += 1
                try:
                    self._slots.wait()
                finally:
                    self._slot_waiters -= 1
            self._in_slots += 1

    def _give_slot(self) -> None:
        """A handler is done with its job: its slot goes to the next async job waiting, or is freed."""
        with self._slots:
            if not self._waiting_tasks:
                self._in_slots -= 1
                if self._slot_waiters:
                    self._slots.notify()
                return
            coroutine = self._waiting_tasks.popleft()
        self._threads.start_task(coroutine)

    def execute(self, run: RunState, claimed: Claimed, step_run: dict[str, Any] | None) -> None:
        """Run the job's handler and settle the job (on a handler thread)."""
        self._take_slot()
        try:
            self._execute(run, claimed, step_run)
        finally:
            self._give_slot()

    def _execute(self, run: RunState, claimed: Claimed, step_run: dict[str, Any] | None) -> None:
        try:
            if run.cancel_requested and self._cancelled_unstarted(run):
                return
            if not self._begin(run):
                return
            watchdog = self._watch_timeout(run)
            try:
                if claimed.undecodable is not None:
                    raise claimed.undecodable
                began = self._handler_starts()
                try:
                    if self._traced:
                        with _otel.attempt(run.job):
                            value = self._call_handler(run, step_run)
                    else:
                        value = self._call_handler(run, step_run)
                finally:
                    self._handler_ends(began)
                encoded = _result(run, value)
            except BaseException as error:  # whatever a handler raises fails its job, not the worker
                self._handler_failed(run, _as_timeout(run, error))
            else:
                self._handler_succeeded(run, encoded)
            finally:
                if watchdog is not None:
                    watchdog.cancel()
        except BaseException:
            # a fault of the worker itself: free the slot; the lease lapses and a rescue returns the job
            log.exception("job %d: recording its outcome failed", run.job_id)
            self._host.done(run)

    async def execute_async(self, run: RunState, step_run: dict[str, Any] | None) -> None:
        """`execute` for a coroutine handler, as a task on the event loop: no handler thread waits on it.

        It holds one of the `concurrency` slots, as a sync handler does (`_start_async`
        took it), until its job is settled. A cancel, a lost lease, a timeout or a
        hand-back cancels the task (the handler gets CancelledError at its next await).
        A failure is written from the loop's executor, so that the loop never waits on
        the database.
        """
        try:
            await self._execute_async(run, step_run)
        finally:
            self._give_slot()

    async def _execute_async(self, run: RunState, step_run: dict[str, Any] | None) -> None:
        try:
            if run.cancel_requested and await asyncio.get_running_loop().run_in_executor(
                None, self._cancelled_unstarted, run
            ):
                return
            if not self._begin(run):
                return
            task = asyncio.current_task()
            run.on_cancelled(_canceller(asyncio.get_running_loop(), task))
            watchdog = self._watch_timeout(run)
            try:
                began = self._handler_starts()
                try:
                    ctx = JobContext(run, self._worker_id, self._pool, self._lease)
                    fn, args = self._target(run, step_run, ctx)
                    try:
                        if self._traced:
                            with _otel.attempt(run.job):
                                value = await fn(*args, ctx)
                        else:
                            value = await fn(*args, ctx)
                    except asyncio.CancelledError:
                        ctx.check_cancelled()  # says why: a lost lease, a timeout, a cancel or a hand-back
                        raise
                finally:
                    self._handler_ends(began)
                encoded = _result(run, value)
            except BaseException as error:  # whatever a handler raises fails its job, not the worker
                if isinstance(error, GeneratorExit) and _closed(task):
                    raise  # the loop is gone and the task with it: nothing more runs
                # (a GeneratorExit the handler raised itself fails its job like any other exception)
                failure = _as_timeout(run, error)
                await asyncio.get_running_loop().run_in_executor(None, self._fail_or_free, run, failure)
            else:
                self._handler_succeeded(run, encoded)  # only queues the write: it does not wait
            finally:
                if watchdog is not None:
                    watchdog.cancel()
        except GeneratorExit:
            raise
        except BaseException:
            log.exception("job %d: recording its outcome failed", run.job_id)
            self._host.done(run)

    def _fail_or_free(self, run: RunState, error: BaseException) -> None:
        try:
            self._handler_failed(run, error)
        except BaseException:
            log.exception("job %d: recording its outcome failed", run.job_id)
            self._host.done(run)

    def _is_coroutine(self, run: RunState, step_run: dict[str, Any] | None) -> bool:
        """Whether the job's handler (or step) is an `async def`, known without reading anything."""
        try:
            if run.run_id is None:
                fn: Callable[..., Any] = self._registry.handler(run.name)
            elif step_run is not None:
                fn = self._registry.step(step_run["name"], run.step)
            else:
                return False
        except LookupError:
            return False  # the thread's run says so
        try:
            known = self._coroutine_fns.get(fn)
            if known is None:
                known = self._coroutine_fns[fn] = inspect.iscoroutinefunction(fn)
        except TypeError:  # a callable object that cannot be hashed: asked every time
            return inspect.iscoroutinefunction(fn)
        return known

    def _cancelled_unstarted(self, run: RunState) -> bool:
        """A cancel reached the job while it waited its turn: its handler never starts, and the
        attempt ends cancelled (True), unless the job was settled otherwise meanwhile (False)."""
        if run.begin_finishing() is not RunStatus.FINISHING:
            return False  # handed back or lost: _begin frees it
        cancelled = JobCancelled(run.job_id, f"job {run.job_id} was cancelled before its handler started")
        self._completer.fail(run, cancelled)
        return True

    def _begin(self, run: RunState) -> bool:
        """The handler may start: False when the job was handed back or lost while it waited."""
        if not run.begin_handler():
            self._host.done(run)
            return False
        self._host.emit("started", run)
        return True

    def _handler_starts(self) -> float:
        with self._lock:
            self._handlers_running += 1
        return time.monotonic()

    def _handler_ends(self, began: float) -> None:
        with self._lock:
            self._handlers_running -= 1
        self._host.handler_ran(time.monotonic() - began)

    def _watch_timeout(self, run: RunState) -> Deadline | None:
        """Time the attempt out (run.time_out) when it runs past its timeout; None without one."""
        seconds = attempt_timeout(run.job, self._registry.policy(run.name))
        if seconds is None:
            return None
        return self._threads.deadlines.call_later(seconds, lambda: run.time_out(seconds))

    def _target(
        self, run: RunState, step_run: dict[str, Any] | None, ctx: JobContext
    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The handler or step to call, and its arguments before the context (a step's
        earlier results go on ctx.results)."""
        if run.run_id is None:
            return self._registry.handler(run.name), (run.args,)
        if step_run is None:
            step_run = self._read_step_run(run.run_id, run.step)
        fn = self._registry.step(step_run["name"], run.step)
        workflow_input = from_json(step_run["input"], f"workflow run {run.run_id}'s input")
        results = from_json(step_run["results"], f"workflow run {run.run_id}'s results")
        ctx._set_results(dict(results or {}))
        return fn, (workflow_input,)

    def _call_handler(self, run: RunState, step_run: dict[str, Any] | None) -> Any:
        ctx = JobContext(run, self._worker_id, self._pool, self._lease)
        fn, args = self._target(run, step_run, ctx)
        value = fn(*args, ctx)
        if value is not None and inspect.isawaitable(value):  # an awaitable from a plain function
            try:
                value = self._threads.await_in_loop(value, run)
            except concurrent.futures.CancelledError:
                ctx.check_cancelled()  # says why: a lost lease, a cancel or a hand-back
                raise
        return value

    def _read_step_run(self, run_id: int, step: str | None) -> dict[str, Any]:
        found = self._completer.retrying(
            _sql.STEP_CONTEXT, {"run_ids": [run_id], "steps": [step]}, f"read workflow run {run_id}", rows=True
        )
        if isinstance(found, Unwritten) or not found:
            raise LookupError(f"workflow run {run_id} could not be read")
        return dict(found[0])

    def _handler_succeeded(self, run: RunState, encoded: Any) -> None:
        outcome = run.begin_finishing()
        if outcome is not RunStatus.FINISHING:
            self._settled_elsewhere(run, outcome)
            return
        self._host.emit("completing", run)
        try:
            self._completer.complete(run, encoded)
        except RuntimeError:
            log.warning("job %d finished after the worker stopped; its lease will lapse", run.job_id)
            self._host.done(run)
            return
        self._host.slot_freed()  # claim while the completion is written

    def _handler_failed(self, run: RunState, error: BaseException) -> None:
        outcome = run.begin_finishing()
        if outcome is not RunStatus.FINISHING:
            if outcome is RunStatus.COMPLETED:
                log.warning("job %d raised after complete_in completed it: %s", run.job_id, one_line(error))
            self._settled_elsewhere(run, outcome)
            return
        if isinstance(error, LeaseLost):
            run.mark_lost()
            self._host.done(run)
            return
        if not isinstance(error, Snooze):  # a snooze is not an error
            try:
                self._host.on_error(error, run.job)
            except BaseException:
                log.exception("on_error raised for job %d", run.job_id)
        self._completer.fail(run, error)

    def _settled_elsewhere(self, run: RunState, outcome: RunStatus) -> None:
        """The handler is done with a job that complete_in, a lost lease or a hand-back already settled."""
        if outcome is RunStatus.COMPLETED:
            state = run.completed_state
            self._host.emit("cancelled" if state == "cancelled" else "completed", run, state=state)
        self._host.done(run)


def _result(run: RunState, value: Any) -> Any:
    """The handler's return value as the job's result; JobTimeout past its timeout (not its result).

    A value JSON cannot hold (a set, a dict with non-string keys, NaN, an object)
    could never be stored, however often the handler ran: the job is discarded at
    once (Discard) rather than run again for the same result.
    """
    if run.timed_out_after is not None:
        raise JobTimeout(run.job_id, run.timed_out_after)
    try:
        return to_jsonb(value, "the handler's result")
    except InvalidArgument as error:
        raise Discard(f"{error}; a result that cannot be stored as JSON discards its job without a retry") from None


def _closed(task: asyncio.Task[Any] | None) -> bool:
    """True when GeneratorExit came from outside: the task's coroutine closed, not run by its loop."""
    try:
        return task is None or asyncio.current_task() is not task
    except RuntimeError:  # no loop is running: the coroutine is being closed by the garbage collector
        return True


def _canceller(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any] | None) -> Callable[[], None]:
    """A hook, safe from any thread, that cancels `task` (a no-op once it is done or the loop is gone)."""

    def cancel() -> None:
        if task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop is closed: the worker stopped
                pass

    return cancel


def _as_timeout(run: RunState, error: BaseException) -> BaseException:
    """Past its timeout, whatever the handler raised (the cancel it was given, mostly) becomes a JobTimeout."""
    if run.timed_out_after is None or isinstance(error, (JobTimeout, LeaseLost)):
        return error
    timeout = JobTimeout(run.job_id, run.timed_out_after)
    timeout.__cause__ = error
    return timeout
