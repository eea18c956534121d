"""Where handlers run: daemon threads for calls, one event loop thread for coroutines, and
one thread for their timeouts (_deadlines.py).

Threads are daemons so that a handler that never returns cannot keep the process
alive after the worker stopped (its job was handed back by then).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ._deadlines import Deadlines
from ._run_state import RunState

log = logging.getLogger("treadle.worker")

T = TypeVar("T")


class HandlerThreads:
    """`size` threads taking calls from a queue, and an event loop started on first need."""

    def __init__(self, size: int, name: str = "treadle-handler") -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True) for i in range(size)]
        for thread in self._threads:
            thread.start()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None  # the event loop thread's ident
        self._loop_lock = threading.Lock()
        self.deadlines = Deadlines(name=f"{name}-timeouts")
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting: list[Coroutine[Any, Any, None]] = []  # given to start_task, not yet tasks
        self._starting_lock = threading.Lock()
        self._closed = False

    def submit(self, call: Callable[[], None]) -> None:
        self._calls.put(call)

    def start_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a coroutine as a task of the event loop (no thread waits on it); it settles its own job.

        From the loop's own thread (a task that freed its slot starts the next) the task
        starts at once. From another, coroutines given while the loop has not yet taken
        the last ones go with them: a claimed batch wakes the loop once, not once a job.
        """
        with self._starting_lock:
            if self._closed:
                coroutine.close()  # the worker stopped: its job's lease lapses, and a rescue returns it
                return
            on_loop = self._on_loop()
            if not on_loop:
                self._starting.append(coroutine)
                if len(self._starting) > 1:
                    return
        if on_loop:
            self._spawn(asyncio.get_running_loop(), coroutine)
            return
        try:
            self._event_loop().call_soon_threadsafe(self._create_tasks)
        except RuntimeError:  # the loop closed meanwhile
            with self._starting_lock:
                stranded, self._starting = self._starting, []
            for waiting in stranded:
                waiting.close()

    def _create_tasks(self) -> None:
        with self._starting_lock:
            coroutines, self._starting = self._starting, []
        loop = asyncio.get_running_loop()
        for coroutine in coroutines:
            self._spawn(loop, coroutine)

    def _spawn(self, loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, None]) -> None:
        task = loop.create_task(coroutine)
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    def _on_loop(self) -> bool:
        """Whether this runs on the event loop's own thread (asked once a job: no exception raised
        off the loop, as asyncio.get_running_loop() would)."""
        return self._loop is not None and threading.get_ident() == self._loop_thread

    def close(self) -> None:
        """Let idle threads end; busy ones end when their call returns. No timeout fires after this,
        and no task starts."""
        with self._starting_lock:
            self._closed = True
        self.deadlines.close()
        for _ in self._threads:
            self._calls.put(None)
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(_cancel_all_and_stop, loop)

    def await_in_loop(self, awaitable: Awaitable[T], run: RunState) -> T:
        """Run a coroutine on the event loop thread and wait for it.

        When the job's `cancelled` fires, the coroutine is cancelled: an async
        handler is aborted at its next await (the caller then asks the context why).
        """
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self._event_loop())
        run.on_cancelled(future.cancel)
        return future.result()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_run_forever, args=(loop,), name="treadle-asyncio", daemon=True)
                thread.start()
                self._loop_thread = thread.ident
                self._loop = loop
            return self._loop

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                call()
            except BaseException:  # a call settles its own job; whatever escapes must not end the thread
                log.exception("a handler thread's call raised")


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.call_soon(loop.stop)
