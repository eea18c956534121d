"""One thread that calls what falls due: the attempt timeouts of the jobs a worker runs.

A timer thread per attempt costs a thread start, a thread switch and a join for
every job that has a timeout, and most production handlers set one: at a few
thousand jobs a second that halved a worker's throughput. Here a timeout is an
entry in a heap, and one thread sleeps until the earliest. A timeout that is
cancelled (its handler returned in time, nearly always) is only marked, and
dropped when it reaches the top, or when at least PURGE_AT marked entries make up
half the heap.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("treadle.worker")

PURGE_AT = 64  # cancelled entries kept before the heap is rebuilt without them (once they are half of it)


class Deadline:
    """A call that `Deadlines` makes when it falls due, unless `cancel()` came first."""

    __slots__ = ("_call", "_owner")

    def __init__(self, owner: Deadlines, call: Callable[[], object]) -> None:
        self._owner = owner
        self._call: Callable[[], object] | None = call

    def cancel(self) -> None:
        self._owner._cancel(self)


class Deadlines:
    """Calls each function given to `call_later` once its delay has passed, from a thread of its own."""

    def __init__(self, name: str = "treadle-deadlines") -> None:
        self._name = name
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # ties are called in the order they were given
        self._cancelled = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None  # started by the first call_later

    def call_later(self, seconds: float, call: Callable[[], object]) -> Deadline:
        """Call `call()` in `seconds` (from the deadline thread: it must be quick and never block).

        Once closed, nothing is called: the worker has stopped and handed its jobs back.
        """
        deadline = Deadline(self, call)
        due = time.monotonic() + seconds
        with self._cond:
            if self._closed:
                deadline._call = None
                return deadline
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (due, next(self._order), deadline))
            if self._heap[0][2] is deadline:  # the thread sleeps until a later one: wake it
                self._cond.notify()
        return deadline

    def close(self) -> None:
        """Call nothing more; the thread ends."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def pending(self) -> int:
        """Calls not yet made nor cancelled."""
        with self._cond:
            return len(self._heap) - self._cancelled

    def _cancel(self, deadline: Deadline) -> None:
        with self._cond:
            if deadline._call is None:
                return  # called already, or cancelled
            deadline._call = None
            self._cancelled += 1
            if self._cancelled >= PURGE_AT and 2 * self._cancelled >= len(self._heap):
                self._heap = [entry for entry in self._heap if entry[2]._call is not None]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _next_due(self) -> Callable[[], object] | None:
        """The next call once it is due (waiting for it), or None when closed."""
        with self._cond:
            while not self._closed:
                while self._heap and self._heap[0][2]._call is None:
                    heapq.heappop(self._heap)
                    self._cancelled -= 1
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                deadline = heapq.heappop(self._heap)[2]
                call, deadline._call = deadline._call, None
                return call
            return None

    def _run(self) -> None:
        while (call := self._next_due()) is not None:
            try:
                call()
            except BaseException:  # one call's failure must not end the others
                log.exception("a deadline's call raised")
