"""Argument checks made before anything is sent to the database.

They check what Python can know for certain (types, integer ranges, time zones)
and raise `InvalidArgument` without touching the caller's transaction. Rules
about values (max_attempts must be at least 1, how long a name may be, ...)
belong to the SQL layer, which refuses them with a stable SQLSTATE. The one
exception is `name`: the worker checks the names it registers and claims with
before it starts, so that a blank one fails at registration, not at the first claim.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from .errors import InvalidArgument

INT4 = (-(2**31), 2**31 - 1)
INT8 = (-(2**63), 2**63 - 1)


def text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidArgument(f"{what} contains a NUL character, which PostgreSQL cannot store")
    return value


def optional_text(value: Any, what: str) -> str | None:
    return None if value is None else text(value, what)


def integer(value: Any, what: str, bounds: tuple[int, int] = INT4) -> int:
    # bool is an int subclass, but True as a priority is a mistake, not a number
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{what} must be an integer, not {type(value).__name__}")
    low, high = bounds
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be between {low} and {high}, got {value}")
    return value


def boolean(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, not {type(value).__name__}")
    return value


def row_id(value: Any, what: str) -> int:
    return integer(value, what, INT8)


def interval(value: Any, what: str) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    raise InvalidArgument(f"{what} must be a datetime.timedelta or None, not {type(value).__name__}")


def intervals(value: Any, what: str) -> list[timedelta] | None:
    """A list of timedeltas, such as a job's backoff; None stays None (the SQL layer bounds the rest)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, timedelta)) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be a list of datetime.timedelta, not {type(value).__name__}")
    items = list(value)
    for index, item in enumerate(items):
        if not isinstance(item, timedelta):
            raise InvalidArgument(f"{what}[{index}] must be a datetime.timedelta, not {type(item).__name__}")
    return items


def moment(value: Any, what: str) -> datetime | timedelta | None:
    """A point in time (an aware datetime) or a delay from the database's now (a timedelta)."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise InvalidArgument(f"{what} must be an aware datetime (with tzinfo), not a naive one")
        return value
    raise InvalidArgument(f"{what} must be an aware datetime, a timedelta or None, not {type(value).__name__}")


def names(value: Any, what: str) -> list[str] | None:
    """A list of names, such as a workflow's steps; None stays None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be a list of names, not {type(value).__name__}")
    return [text(name, f"{what}[{index}]") for index, name in enumerate(value)]


def seconds(value: Any, what: str, *, allow_zero: bool) -> float:
    """A duration given as seconds (int or float) or as a timedelta."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidArgument(f"{what} must be a number of seconds or a timedelta, not {type(value).__name__}")
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidArgument(f"{what} must be a finite number of seconds, got {value}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidArgument(f"{what} must be {'at least 0' if allow_zero else 'positive'}, got {value}")
    return float(value)


def interval_text(delta: timedelta) -> str:
    """A PostgreSQL interval literal for `delta`, exact to the microsecond."""
    return f"{delta.days} days {delta.seconds}.{delta.microseconds:06d} seconds"


def name(value: Any, what: str) -> str:
    """A name the worker registers or claims with (handler, workflow, step, queue, worker id): not blank."""
    checked = text(value, what)
    if not checked.strip():
        raise InvalidArgument(f"{what} must not be empty")
    return checked
