"""Retrying what a lost connection interrupted: which errors to retry, and how long to wait between tries."""

from __future__ import annotations

import psycopg


def is_transient(error: BaseException) -> bool:
    """True for errors that retrying on a fresh connection can cure.

    OperationalError covers a lost or refused connection, an administrator's
    termination, a pool that timed out, serialization failures and deadlocks.
    """
    return isinstance(error, psycopg.OperationalError)


class Backoff:
    """Delays between retries of a failing operation: `first` seconds, doubling up to `cap`."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self._first = first
        self._cap = cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self._cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self._first


def one_line(error: BaseException) -> str:
    """An exception as one log-friendly line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
