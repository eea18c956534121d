"""LISTEN treadle_jobs on a connection of its own, to wake the claim loop at once.

A notification is a hint, never the truth: the loop polls anyway, so a listener
that cannot connect, or a LISTEN refused (PgBouncer in transaction mode), only
makes pickup wait for the next poll. The listener reconnects with backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from treadle import _sql
from treadle._db import Backoff, one_line

log = logging.getLogger("treadle.worker")

# how often a quiet listener looks whether it should stop
_TICK = 0.5


class Listener:
    """A thread that calls `wake()` when work becomes claimable on one of `queues`."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], queues: Iterable[str],
                 wake: Callable[[], None], name: str = "treadle-listener") -> None:
        self._connect = connect
        self._queues = frozenset(queues)
        self._wake = wake
        self._stop = threading.Event()
        self.listening = threading.Event()  # set while LISTEN is in place
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = Backoff(first=0.2, cap=10.0)
        while not self._stop.is_set():
            try:
                self._listen(backoff)
            except psycopg.Error as error:
                self.listening.clear()
                delay = backoff.next()
                log.info("LISTEN %s unavailable (%s); polling only, trying again in %.1f s",
                         _sql.CHANNEL_JOBS, one_line(error), delay)
                self._stop.wait(delay)
        self.listening.clear()

    def _listen(self, backoff: Backoff) -> None:
        with self._connect() as conn:
            conn.execute(_sql.LISTEN_JOBS)
            self.listening.set()
            backoff.reset()
            self._wake()  # work may have arrived while nobody listened
            while not self._stop.is_set():
                for notify in conn.notifies(timeout=_TICK):
                    if notify.payload in self._queues:
                        self._wake()
