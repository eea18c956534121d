"""Pure pieces of the worker, without a database: options, registration, the completion buffer,
the timeouts' deadlines."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from treadle import InvalidArgument, Step, Worker
from treadle._completer import CompletionBuffer
from treadle._deadlines import PURGE_AT, Deadlines
from treadle._handler_threads import HandlerThreads
from treadle._retry import Backoff, one_line

DSN = "postgresql://nobody@127.0.0.1:1/none"  # never connected to: nothing here runs a worker


def handler(args: Any, ctx: Any) -> None:
    return None


def step(input: Any, ctx: Any) -> None:
    return None


# options
def test_durations_are_seconds_or_timedeltas() -> None:
    worker = Worker(
        DSN,
        poll_interval=timedelta(milliseconds=250),
        lease=2,
        heartbeat_interval=0.5,
        rescue_interval=timedelta(seconds=3),
        stop_timeout=0,
    )
    assert (worker.poll_interval, worker.lease, worker.heartbeat_interval) == (0.25, 2.0, 0.5)
    assert (worker.rescue_interval, worker.stop_timeout) == (3.0, 0.0)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("poll_interval", 0, "poll_interval must be positive"),
        ("lease", -1, "lease must be positive"),
        ("lease", float("nan"), "lease must be a finite number"),
        ("heartbeat_interval", float("inf"), "heartbeat_interval must be a finite number"),
        ("rescue_interval", "5", "rescue_interval must be a number of seconds or a timedelta"),
        ("stop_timeout", -0.5, "stop_timeout must be at least 0"),
        ("lease", True, "lease must be a number of seconds"),
        ("concurrency", 0, "concurrency must be between 1 and 1000"),
        ("concurrency", 1001, "concurrency must be between 1 and 1000"),
        ("concurrency", 2.5, "concurrency must be an integer"),
        ("queues", "default", "queues must be a list of queue names, not str"),
        ("queues", [], "queues must name at least one queue"),
        ("queues", ["mail", " "], "queue name must not be empty"),
        ("queues", ["mail", 3], "queue name must be a string"),
        ("backoff", 5, "backoff must be callable"),
        ("on_error", "log", "on_error must be callable"),
        ("on_event", 1, "on_event must be callable"),
        ("worker_id", "", "worker_id must not be empty"),
        ("listen", "yes", "listen must be True or False, not str"),
        ("prepared_statements", "auto", "prepared_statements must be True, False or None, not str"),
        ("prepared_statements", 1, "prepared_statements must be True, False or None, not int"),
    ],
)
def test_bad_options_are_refused(option: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Worker(DSN, **{option: value})


def test_heartbeat_must_come_before_the_lease_ends() -> None:
    with pytest.raises(InvalidArgument, match=r"heartbeat_interval \(30 s\) must be shorter than lease \(30 s\)"):
        Worker(DSN, lease=30, heartbeat_interval=30)


def test_options_are_checked_once_into_a_frozen_object() -> None:
    worker = Worker(DSN, queues=["mail", "sms", "mail"], concurrency=3, retention_interval=None)
    assert (worker.queues, worker.concurrency, worker.claim_ahead) == (["mail", "sms"], 3, 3)
    assert worker.retention_interval is None and worker.worker_id.count(":") == 2
    worker.queues.append("changed")  # a copy: the options stay as checked
    assert worker.queues == ["mail", "sms"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        worker._options.concurrency = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        worker.concurrency = 5  # type: ignore[misc]
    assert worker.concurrency == 3


def test_database_must_be_a_dsn_or_a_pool() -> None:
    with pytest.raises(InvalidArgument, match=r"connection string or a psycopg_pool\.ConnectionPool, not int"):
        Worker(123)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must not be empty"):
        Worker("  ")


def test_queues_keep_their_order_without_repeats() -> None:
    assert Worker(DSN, queues=["mail", "default", "mail"]).queues == ["mail", "default"]


def test_default_worker_ids_differ() -> None:
    assert Worker(DSN).worker_id != Worker(DSN).worker_id


# registration
def test_handlers_register_four_ways() -> None:
    worker = Worker(DSN)
    assert worker.register("plain", handler) is handler

    @worker.register
    def bare(args: Any, ctx: Any) -> None:
        return None

    @worker.register("named")
    def something(args: Any, ctx: Any) -> None:
        return None

    @worker.handler("decorated")
    def other(args: Any, ctx: Any) -> None:
        return None

    assert worker._registry.claim_names() == ["plain", "bare", "named", "decorated"]
    assert callable(bare) and callable(something) and callable(other)


@pytest.mark.parametrize(
    "name, fn, message",
    [
        ("", handler, "handler name must not be empty"),
        (7, handler, "handler name must be a string"),
        ("send", "not a function", "the handler for 'send' must be callable"),
        ("workflow:x", handler, "belong to workflow steps"),
    ],
)
def test_bad_handlers_are_refused(name: Any, fn: Any, message: str) -> None:
    worker = Worker(DSN)
    with pytest.raises(InvalidArgument, match=message):
        worker.register(name, fn)
    assert worker._registry.claim_names() == []


def test_a_name_has_one_handler() -> None:
    worker = Worker(DSN)
    worker.register("send", handler)
    with pytest.raises(InvalidArgument, match="a handler for 'send' is already registered"):
        worker.register("send", handler)


def test_workflows_take_steps_or_pairs() -> None:
    worker = Worker(DSN)
    worker.workflow("trip", [Step("reserve", step), ("charge", step)])
    assert worker._registry.claim_names() == ["workflow:trip/reserve", "workflow:trip/charge"]
    assert list(worker._registry.workflows["trip"]) == ["reserve", "charge"]


@pytest.mark.parametrize(
    "steps, message",
    [
        ([], "needs at least one step"),
        ("reserve", "steps must be a list"),
        ([("a", handler), ("a", handler)], "repeats the step name 'a'"),
        ([("a", handler, "extra")], "after of step 'a' of workflow 'trip' must be a list of step names, not str"),
        ([("a", handler, [], "extra")], "a workflow step is a Step"),
        (["a"], "a workflow step is a Step"),
        ([("", handler)], "step name must not be empty"),
        ([("a", None)], "step 'a' of workflow 'trip' needs a callable"),
    ],
)
def test_bad_workflows_are_refused(steps: Any, message: str) -> None:
    worker = Worker(DSN)
    with pytest.raises(InvalidArgument, match=message):
        worker.workflow("trip", steps)
    assert worker._registry.workflows == {}


def test_a_worker_without_handlers_does_not_run() -> None:
    with pytest.raises(RuntimeError, match="register at least one handler or workflow"):
        Worker(DSN).run()


# the completion buffer
class Recorder:
    """A write function that keeps its batches."""

    def __init__(self, fail_first: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail_first = fail_first
        self.written = threading.Event()

    def __call__(self, batch: list[int]) -> None:
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("the database is away")
        self.batches.append(batch)
        self.written.set()


def test_items_added_together_are_written_in_one_batch() -> None:
    write = Recorder()
    buffer = CompletionBuffer(write, delay=0.5)
    for item in range(5):
        buffer.add(item)
    assert write.written.wait(10)
    assert buffer.close(10)
    assert write.batches == [[0, 1, 2, 3, 4]]


def test_a_full_batch_is_written_without_waiting_and_batches_are_capped() -> None:
    write = Recorder()
    buffer = CompletionBuffer(write, delay=3600, max_batch=2)  # only a full batch or close() writes
    for item in range(5):
        buffer.add(item)
    deadline = time.monotonic() + 10
    while len(write.batches) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert write.batches == [[0, 1], [2, 3]]
    assert buffer.pending() == 1
    assert buffer.close(10)
    assert write.batches == [[0, 1], [2, 3], [4]]
    assert buffer.pending() == 0


def test_close_writes_what_is_pending_and_refuses_more() -> None:
    write = Recorder()
    buffer = CompletionBuffer(write, delay=3600)
    buffer.add(1)
    assert buffer.close(10)
    assert write.batches == [[1]]
    with pytest.raises(RuntimeError, match="closed"):
        buffer.add(2)
    assert write.batches == [[1]]


def test_a_failed_write_is_logged_and_the_buffer_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    write = Recorder(fail_first=True)
    buffer = CompletionBuffer(write, delay=0)
    with caplog.at_level(logging.ERROR, logger="treadle.worker"):
        buffer.add(1)
        deadline = time.monotonic() + 10
        while buffer.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        buffer.add(2)
        assert write.written.wait(10)
    assert buffer.close(10)
    assert write.batches == [[2]]
    assert "writing 1 buffered completions failed" in caplog.text


def test_a_held_up_writer_hands_off_and_another_thread_writes_meanwhile() -> None:
    """hand_off: while the writer is held up in a write (a slow handler run inline), a new
    thread writes what comes next; the old one ends when its write returns."""
    held = threading.Event()
    go_on = threading.Event()
    writers: list[int] = []
    batches: list[list[int]] = []

    def write(batch: list[int]) -> None:
        writers.append(threading.get_ident())
        batches.append(batch)
        if batch == [1]:
            held.set()
            assert go_on.wait(10)
            time.sleep(0.2)  # still in its write when close() is called: close waits for it

    buffer = CompletionBuffer(write, delay=0)
    buffer.add(1)
    assert held.wait(10)
    first = writers[0]
    assert not buffer.hand_off(threading.get_ident())  # only the writer itself is handed off from
    buffer.add(2)
    time.sleep(0.1)
    assert batches == [[1]]  # without a hand-off, [2] waits behind the held write
    assert buffer.hand_off(first)
    deadline = time.monotonic() + 10
    while len(batches) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batches == [[1], [2]]
    assert writers[1] != first
    while buffer.pending() != 1 and time.monotonic() < deadline:  # the held write is still counted
        time.sleep(0.01)
    assert buffer.pending() == 1
    assert not buffer.hand_off(first)  # handed off once
    go_on.set()
    buffer.add(3)
    assert buffer.close(10)
    assert batches == [[1], [2], [3]]
    assert writers[2] == writers[1]
    assert buffer.pending() == 0
    assert not buffer.hand_off(writers[1])  # closed


def test_a_hand_off_after_the_writers_write_returned_is_refused_and_starts_no_thread() -> None:
    """hand_off races the write it was meant for: the watch found a handler slow, and the
    writer came back to wait for items before hand_off ran. Nothing holds it, so the hand-off
    is refused: no thread starts, none waits beside the writer, and it writes every later
    batch, close() included."""
    writers: list[threading.Thread] = []
    batches: list[list[int]] = []

    def write(batch: list[int]) -> None:
        writers.append(threading.current_thread())
        batches.append(batch)

    buffer = CompletionBuffer(write, delay=0)
    buffer.add(1)
    deadline = time.monotonic() + 10
    while buffer.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    old = writers[0]
    assert not buffer.hand_off(old.ident or 0)
    assert buffer.threads() == 1
    for item in range(2, 40):
        buffer.add(item)
    assert buffer.close(10)
    assert sorted(i for batch in batches for i in batch) == list(range(1, 40))
    assert all(thread is old for thread in writers)
    old.join(2)
    assert not old.is_alive()
    assert buffer.threads() == 0


def test_a_writer_handed_off_from_waits_as_a_spare_that_the_next_hand_off_takes() -> None:
    """Forty writes held up and handed off from, one after another: each hand_off takes the
    writer the one before left as a spare (its sequel returned), so two threads do all the
    writes; with `writers=2`, a hand_off that comes before the spare is back is refused rather
    than starting a third. close() ends both."""
    held = threading.Event()
    gates = [threading.Event() for _ in range(40)]  # one a turn: the held sequel waits on its own
    writers: list[threading.Thread] = []
    batches: list[list[int]] = []

    def write(batch: list[int]) -> Callable[[], None] | None:
        writers.append(threading.current_thread())
        batches.append(batch)
        if batch[0] >= 0:
            return None
        gate = gates[-1 - batch[0]]

        def slow_handler() -> None:  # a sequel, as the worker's inline handlers are
            held.set()
            assert gate.wait(10)

        return slow_handler

    buffer = CompletionBuffer(write, delay=0, writers=2)
    deadline = time.monotonic() + 30
    for turn in range(40):
        held.clear()
        buffer.add(-1 - turn)
        assert held.wait(10)
        while not buffer.hand_off(writers[-1].ident or 0):  # refused until the last spare is back
            assert time.monotonic() < deadline, "no spare came back"
            time.sleep(0.001)
        assert buffer.threads() == 2
        gates[turn].set()
        buffer.add(turn)
        while buffer.pending() and time.monotonic() < deadline:
            time.sleep(0.001)
    assert len(set(writers)) == 2
    assert buffer.close(10)
    assert sorted(i for batch in batches for i in batch) == list(range(-40, 40))
    for thread in set(writers):
        thread.join(2)
        assert not thread.is_alive()
    assert buffer.threads() == 0


def test_buffer_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="delay must not be negative"):
        CompletionBuffer(Recorder(), delay=-1)
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        CompletionBuffer(Recorder(), max_batch=0)
    with pytest.raises(ValueError, match="writers must be at least 1"):
        CompletionBuffer(Recorder(), writers=0)


# small helpers
def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(first=0.1, cap=0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next() == 0.1


def test_errors_are_logged_on_one_line() -> None:
    assert one_line(ValueError("first\nsecond")) == "ValueError: first"
    assert one_line(KeyError()) == "KeyError"


# the timeouts' deadlines
def test_deadlines_call_in_the_order_they_fall_due_from_one_thread() -> None:
    deadlines = Deadlines()
    calls: list[tuple[str, str]] = []
    done = threading.Event()

    def call(label: str) -> None:
        calls.append((label, threading.current_thread().name))
        if len(calls) == 3:
            done.set()

    deadlines.call_later(0.3, lambda: call("third"))
    deadlines.call_later(0.1, lambda: call("first"))  # earlier than the one the thread sleeps for
    deadlines.call_later(0.2, lambda: call("second"))
    assert done.wait(10)
    assert [label for label, _ in calls] == ["first", "second", "third"]
    assert {thread for _, thread in calls} == {"treadle-deadlines"}
    assert deadlines.pending() == 0
    deadlines.close()


def test_a_cancelled_deadline_is_never_called_and_the_heap_sheds_cancelled_entries() -> None:
    deadlines = Deadlines()
    called = threading.Event()
    kept = deadlines.call_later(0.2, called.set)
    wrong: list[str] = []
    cancelled = [deadlines.call_later(0.1, lambda: wrong.append("cancelled")) for _ in range(3)]
    for deadline in cancelled:
        deadline.cancel()
        deadline.cancel()  # twice is once
    assert deadlines.pending() == 1
    assert called.wait(10)
    assert wrong == []
    kept.cancel()  # after its call: nothing
    later = [deadlines.call_later(3600, lambda: None) for _ in range(2 * PURGE_AT)]
    for deadline in later:
        deadline.cancel()
    assert deadlines.pending() == 0 and len(deadlines._heap) < PURGE_AT
    deadlines.close()


def test_a_deadline_that_raises_is_logged_and_the_others_are_still_called(caplog: pytest.LogCaptureFixture) -> None:
    deadlines = Deadlines()
    called = threading.Event()

    def broken() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="treadle.worker"):
        deadlines.call_later(0.01, broken)
        deadlines.call_later(0.05, called.set)
        assert called.wait(10)
    assert "a deadline's call raised" in caplog.text
    deadlines.close()


def test_closed_deadlines_call_nothing_and_their_thread_ends() -> None:
    deadlines = Deadlines(name="treadle-deadlines-closing")
    calls: list[str] = []
    deadlines.call_later(0.2, lambda: calls.append("before close"))
    deadlines.close()
    deadlines.call_later(0, lambda: calls.append("after close"))
    assert deadlines.pending() == 0
    assert not [t for t in threading.enumerate() if t.name == "treadle-deadlines-closing"]
    time.sleep(0.3)
    assert calls == []


# the handler threads
def test_handler_threads_run_blocking_calls_side_by_side() -> None:
    """Calls given at once, each of which blocks until all of them run: every thread takes one."""
    threads = HandlerThreads(4, name="test-handler")
    barrier = threading.Barrier(4, timeout=5)
    done: list[int] = []

    def meet() -> None:
        barrier.wait()
        done.append(1)

    try:
        for turn in range(1, 4):  # the threads go idle between turns and are woken again
            for _ in range(4):
                threads.submit(meet)
            deadline = time.monotonic() + 10
            while len(done) < 4 * turn and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(done) == 4 * turn, "a call waited for a busy thread while another was idle"
            assert not barrier.broken
    finally:
        threads.close()


def test_handler_threads_keep_up_with_more_calls_than_threads() -> None:
    threads = HandlerThreads(3, name="test-handler")
    ran: list[int] = []
    try:
        for i in range(500):
            threads.submit(functools.partial(ran.append, i))
        deadline = time.monotonic() + 10
        while len(ran) < 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(ran) == list(range(500))
    finally:
        threads.close()


def test_closed_handler_threads_run_the_calls_given_and_end() -> None:
    threads = HandlerThreads(2, name="test-handler")
    release = threading.Event()
    ran: list[str] = []

    def blocked(name: str) -> None:
        release.wait(5)
        ran.append(name)

    threads.submit(functools.partial(blocked, "blocked"))
    threads.submit(functools.partial(blocked, "blocked too"))
    for name in ("a", "b", "c"):
        threads.submit(functools.partial(ran.append, name))
    threads.close()
    release.set()
    for thread in threads._threads:
        thread.join(5)
        assert not thread.is_alive(), "a handler thread outlived close() and its calls"
    assert sorted(ran) == ["a", "b", "blocked", "blocked too", "c"]


def test_a_worker_runs_at_most_1000_handlers_and_steps() -> None:
    """treadle.claim takes at most 1000 names: each handler and each workflow step is one."""
    worker = Worker(DSN)
    for n in range(990):
        worker.register(f"job{n}", handler)
    worker.workflow("ten", [(f"s{n}", step) for n in range(10)])
    assert len(worker._registry.claim_names()) == 1000
    assert worker._registry.claim_names()[-1] == "workflow:ten/s9"
    with pytest.raises(InvalidArgument, match="at most 1000 handlers and workflow steps"):
        worker.workflow("more", [("one", step)])
    with pytest.raises(InvalidArgument, match="this one would run 1001"):
        worker.register("one_more", handler)
    assert "more" not in worker._registry.workflows and "one_more" not in worker._registry.handlers
