"""Buffered completions: successes wait a few milliseconds so that many finish in one statement.

A worker finishing hundreds of short jobs a second would otherwise spend a round
trip and a commit on each; `treadle.complete_many` takes them all at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("treadle.worker")

T = TypeVar("T")


class CompletionBuffer(Generic[T]):
    """Collects items and hands them to `write` in batches, from a thread of its own.

    A batch is written `delay` seconds after its first item arrived, or at once when
    it holds `max_batch` items, when `idle()` says no more items are on their way
    (waiting would only delay these), or when the buffer is closing. `write` must
    deal with its own failures: an exception it raises is logged and its batch is
    dropped. `idle` is called with the buffer's lock held: it must not call back
    into the buffer.
    """

    def __init__(self, write: Callable[[list[T]], None], *, delay: float = 0.005,
                 max_batch: int = 500, idle: Callable[[], bool] | None = None,
                 name: str = "treadle-completions") -> None:
        if delay < 0:
            raise ValueError(f"delay must not be negative, got {delay}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._write = write
        self._delay = delay
        self._max_batch = max_batch
        self._idle = idle
        self._items: list[T] = []
        self._writing = 0  # items taken from the buffer whose write has not returned
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, item: T) -> None:
        with self._cond:
            if self._closing:
                raise RuntimeError("the completion buffer is closed")
            self._items.append(item)
            self._cond.notify_all()

    def pending(self) -> int:
        """Items added whose write has not finished."""
        with self._cond:
            return len(self._items) + self._writing

    def close(self, timeout: float | None = None) -> bool:
        """Write what is buffered now, then stop. True when everything was written in time."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items:
                    return  # closing, and nothing left
                deadline = time.monotonic() + self._delay
                while len(self._items) < self._max_batch and not self._closing:
                    if self._idle is not None and self._idle():
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch = self._items[: self._max_batch]
                del self._items[: self._max_batch]
                self._writing = len(batch)
            try:
                self._write(batch)
            except Exception:
                log.exception("writing %d buffered completions failed", len(batch))
            finally:
                with self._cond:
                    self._writing = 0
                    self._cond.notify_all()
