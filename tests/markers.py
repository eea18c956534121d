"""Markers that follow from what a test uses, and the guard that keeps them honest.

A fixture that starts a process or a browser says so with `@marks_users(...)` under its
`@pytest.fixture`; every test that uses it, directly or through other fixtures, gets those
markers at collection (tests/conftest.py calls mark_fixture_users). While a test that has
neither `subprocess` nor `browser` sets up or runs, starting a process raises
UnmarkedProcess before the process starts, so a forgotten marker fails the test instead of
letting it run in `make test-fast`'s tier.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

import pytest

# fixture name -> the markers each test that uses it gets (filled by @marks_users)
FIXTURE_MARKS: dict[str, tuple[pytest.MarkDecorator, ...]] = {}
# the markers that allow a test to start a process
PROCESS_MARKERS = ("subprocess", "browser")

F = TypeVar("F", bound=Callable[..., Any])


def marks_users(*marks: pytest.MarkDecorator) -> Callable[[F], F]:
    """A fixture's decorator, under @pytest.fixture: every test that uses the fixture,
    directly or through another fixture, carries these markers."""

    def register(fixture: F) -> F:
        FIXTURE_MARKS[fixture.__name__] = marks
        return fixture

    return register


def mark_fixture_users(items: Sequence[pytest.Item]) -> None:
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            for mark in FIXTURE_MARKS.get(name, ()):
                item.add_marker(mark)


class UnmarkedProcess(Exception):
    """A test without the subprocess or browser marker tried to start a process."""


# the test whose setup or body runs now and may not start a process (empty: any may start)
_guarded: list[pytest.Item] = []


def _refuse(command: object) -> NoReturn:
    raise UnmarkedProcess(
        f"{_guarded[-1].nodeid} starts a process ({command!r}) but is not marked subprocess or browser: "
        "mark the fixture that starts it (@marks_users) or the test"
    )


_popen_init = subprocess.Popen.__init__
_fork = os.fork
_forkpty = os.forkpty


def _checked_popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    if _guarded:
        self._child_created = False  # type: ignore[attr-defined]  # Popen.__del__ then has nothing to clean up
        _refuse(args[0] if args else kwargs.get("args"))
    _popen_init(self, *args, **kwargs)


def _checked_fork() -> int:
    if _guarded:
        _refuse("os.fork()")
    return _fork()


def _checked_forkpty() -> tuple[int, int]:
    if _guarded:
        _refuse("os.forkpty()")
    return _forkpty()


# subprocess.run, asyncio's subprocesses and Playwright's driver all go through Popen; pty.fork
# through os.forkpty
subprocess.Popen.__init__ = _checked_popen_init  # type: ignore[method-assign]
os.fork = _checked_fork
os.forkpty = _checked_forkpty


@contextlib.contextmanager
def no_unmarked_processes(item: pytest.Item) -> Iterator[None]:
    """Around a test's setup and body: no process unless the test is marked for it."""
    guarded = not any(item.get_closest_marker(m) for m in PROCESS_MARKERS)
    if guarded:
        _guarded.append(item)
    try:
        yield
    finally:
        if guarded:
            _guarded.pop()


@contextlib.contextmanager
def processes_allowed() -> Iterator[None]:
    """Start processes that belong to the session, not to the test that happens to start them."""
    saved = _guarded[:]
    _guarded.clear()
    try:
        yield
    finally:
        _guarded[:] = saved
