"""How the faces (the CLI and the dashboard) write values for people: times, waits,
durations, and a queue's limits. One module, so that both faces say the same thing.

Each face chooses only its placeholder for a missing value ("-" in a terminal, "—" on
a page) and the dashboard its clock (UTC, which its pages name).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0, "ms": 0.001}
DURATION_PATTERN = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|min|w|d|h|m|s)")
DURATION_HINT = "write it like 30s, 10m, 2h, 7d, 1w or 1h30m"


class DurationError(ValueError):
    """Text that is not a duration `duration` reads; the message says what to write."""


def duration(text: str, what: str) -> timedelta:
    """A duration such as 90s, 10m, 2h, 7d or 1h30m; DurationError otherwise."""
    compact = text.strip().lower()
    pieces = DURATION_PATTERN.findall(compact)
    if not compact or "".join(f"{n}{u}" for n, u in pieces) != compact.replace(" ", ""):
        raise DurationError(f"{what}: {text!r} is not a duration: {DURATION_HINT}")
    try:
        return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in pieces))
    except OverflowError:
        raise DurationError(f"{what}: {text!r} is too long a duration") from None


def span(value: timedelta | None) -> str:
    """A duration as `duration` reads it back: 1s, 90s, 1m, 7d (its largest whole unit); - for none."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def when(value: datetime | None, *, utc: bool = False, missing: str = "-") -> str:
    """A time to the second: with its offset, or (utc) in UTC without one."""
    if value is None:
        return missing
    if utc:
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return value.isoformat(sep=" ", timespec="seconds")


def age(value: timedelta | None, *, missing: str = "-") -> str:
    """A wait or a run as people say it: under 10 s to the tenth ('0.3 s', '4.2 s', '5 s'),
    then in its two largest units, the smaller left out when zero: '45 s', '3 min 5 s',
    '3 min', '2 h 10 min', '4 d 3 h'. Cut down, never rounded up; a negative one is '0 s'."""
    if value is None:
        return missing
    exact = max(value.total_seconds(), 0.0)
    if exact < 10:
        return f"{int(exact * 10) / 10:.1f}".removesuffix(".0") + " s"
    seconds = int(exact)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def limits_text(settings: dict[str, Any]) -> str:
    """A queue's settings (treadle.queue_settings' columns) in one line: concurrency 2,
    rate 10/1s, max depth 100, keep completed 7d, keep failed 30d (or -)."""
    parts = []
    if settings["concurrency"] is not None:
        parts.append(f"concurrency {settings['concurrency']}")
    if settings["rate_limit"] is not None:
        parts.append(f"rate {settings['rate_limit']}/{span(settings['rate_period'])}")
    if settings["max_depth"] is not None:
        parts.append(f"max depth {settings['max_depth']:,}")
    if settings["retain_completed"] is not None:
        parts.append(f"keep completed {span(settings['retain_completed'])}")
    if settings["retain_failed"] is not None:
        parts.append(f"keep failed {span(settings['retain_failed'])}")
    if settings.get("key_ordered"):
        parts.append("ordered lanes")
    elif settings.get("key_limit") is not None:
        parts.append(f"{settings['key_limit']} per key")
    return ", ".join(parts) or "-"
