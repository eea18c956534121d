"""How values look on the page: times, ages, counts, errors, JSON, and the chart.

Everything here returns plain text (or numbers for the chart); Jinja escapes it
when it lands in a template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from .. import _display
from .._display import span
from ..models import JOB_STATES
from .queries import RawJson, Row, StateCount
from .run_graph import step_kind


def when(value: datetime | None) -> str:
    """A timestamp in UTC (the pages' clock) to the second."""
    return _display.when(value, utc=True, missing="—")


def age(value: timedelta | None) -> str:
    """A duration in its two largest units, as the CLI writes it."""
    return _display.age(value, missing="—")


def clock(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%H:%M:%S")


def relative(value: datetime | None, now: datetime) -> str:
    """'12 s ago' or 'in 3 min', against the database's clock."""
    if value is None:
        return "—"
    delta = now - value
    if delta < timedelta(0):
        return f"in {age(-delta)}"
    return f"{age(delta)} ago"


def count(value: StateCount | None) -> str:
    """An exact count with thousands separators; an estimate rounded and marked with ≈."""
    if value is None:
        return "0"
    if not value.estimated:
        return f"{value.jobs:,}"
    n = value.jobs
    if n >= 1_000_000:
        return f"≈{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"≈{n / 1000:.0f}k"
    if n >= 1000:
        return f"≈{n / 1000:.1f}k"
    return f"≈{n}"


def error_summary(text: str | None, limit: int = 160) -> str:
    """What an error says in one line, cut to `limit` characters.

    For a Python traceback that is the exception's type and message (of the last
    exception raised, when one was raised while handling another; of the group, for
    an exception group): the first unindented line after the last frame, not
    "Traceback (most recent call last):".
    For any other text, its first non-blank line.
    """
    if not text:
        return ""
    lines = text.splitlines()
    if lines[0].startswith("  + Exception Group Traceback"):
        lines = [ln[4:] for ln in lines if ln.startswith("  | ")]  # the outer group, out of its box
    frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')]
    if frames:
        after = [ln for ln in lines[frames[-1] + 1 :] if ln.strip() and not ln[:1].isspace()]
        lines = after or lines
    line = next((ln.strip() for ln in lines if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def needs_more(text: str | None, limit: int = 160) -> bool:
    """Whether an error has more than its summary shows."""
    return bool(text) and error_summary(text, limit) != (text or "").strip()


def pretty_json(value: Any) -> str:
    """JSON indented; a value too deep to decode, as the database's text."""
    if isinstance(value, RawJson):
        return value.text
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def compact_json(value: Any, limit: int = 200) -> str:
    """JSON on one line, cut to `limit` characters."""
    text = value.text if isinstance(value, RawJson) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_raw_json(value: Any) -> bool:
    return isinstance(value, RawJson)


def percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100:.0f}%"


def error_time(value: Any) -> str:
    """The `at` of an entry in a job's error history (an ISO 8601 string in JSON)."""
    if not isinstance(value, str):
        return "—"
    try:
        return when(datetime.fromisoformat(value))
    except ValueError:
        return value


# What treadle.retry and treadle.cancel accept (sql/src/060_control.sql), so the pages
# offer only actions that can apply; a test holds these to what the functions do.
RETRY_FROM = frozenset({"discarded", "cancelled", "retryable"})
CANCEL_FROM = frozenset({"available", "retryable", "blocked"})  # and running, until a cancel is requested;
# and a discarded job that blocks its ordered lane (it holds its key's slot: 034_key_lanes.sql)


def can_retry(job: Row) -> bool:
    return job["state"] in RETRY_FROM


def blocks_lane(job: Row, reasons: list[Row]) -> bool:
    """A failed head of an ordered lane: discarded, and treadle.explain says it blocks its lane."""
    return job["state"] == "discarded" and any(r["reason"] == "lane_blocked" for r in reasons)


def can_cancel(job: Row, lane_head: bool = False) -> bool:
    """lane_head: the job blocks its ordered lane (blocks_lane), which treadle.cancel takes out of it."""
    return (
        job["state"] in CANCEL_FROM
        or (job["state"] == "running" and not job.get("cancel_requested"))
        or (lane_head and job["state"] == "discarded")
    )


def can_retry_step(step: Row) -> bool:
    """A step's job that finished without a result; a retryable one runs again by itself."""
    return step["job_id"] is not None and step["state"] in RETRY_FROM - {"retryable"}


@dataclass(frozen=True)
class Bar:
    x: float
    completed_y: float
    completed_height: float
    discarded_y: float
    discarded_height: float
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bar_width: float
    bars: list[Bar]
    peak: int
    completed: int
    discarded: int
    first_minute: str
    last_minute: str


CHART_WIDTH = 720
CHART_HEIGHT = 96


def chart(rows: list[Row]) -> Chart:
    """Stacked bars of jobs finished per minute: completed below, discarded on top."""
    peak = max((int(r["completed"]) + int(r["discarded"]) for r in rows), default=0)
    slot = CHART_WIDTH / max(len(rows), 1)
    scale = CHART_HEIGHT / peak if peak else 0.0
    bars = []
    for i, row in enumerate(rows):
        done, dropped = int(row["completed"]), int(row["discarded"])
        done_height, dropped_height = done * scale, dropped * scale
        minute = row["minute"].astimezone(timezone.utc).strftime("%H:%M")
        bars.append(
            Bar(
                x=i * slot,
                completed_y=CHART_HEIGHT - done_height,
                completed_height=done_height,
                discarded_y=CHART_HEIGHT - done_height - dropped_height,
                discarded_height=dropped_height,
                title=f"{minute} UTC: {done:,} completed, {dropped:,} discarded",
            )
        )
    first = rows[0]["minute"] if rows else None
    last = rows[-1]["minute"] if rows else None
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        bar_width=max(slot - 2, 1),
        bars=bars,
        peak=peak,
        completed=sum(int(r["completed"]) for r in rows),
        discarded=sum(int(r["discarded"]) for r in rows),
        first_minute=first.astimezone(timezone.utc).strftime("%H:%M") if first else "",
        last_minute=last.astimezone(timezone.utc).strftime("%H:%M") if last else "",
    )


@dataclass(frozen=True)
class DepthChart:
    width: int
    height: int
    waiting: str  # SVG polyline points
    running: str
    samples: int
    peak: int
    latest_waiting: int
    latest_running: int
    since: str  # the first sample's time, UTC
    start: str  # the chart's left edge, UTC
    estimated: bool


DEPTH_SPAN_MIN = timedelta(minutes=5)
DEPTH_SPAN_MAX = timedelta(hours=1)


def depth_chart(samples: list[Any], now: datetime) -> DepthChart:
    """Lines of waiting (available + retryable) and running jobs, from the first sample
    (at least 5 minutes, at most an hour ago) to now."""
    span = min(max(now - samples[0].at, DEPTH_SPAN_MIN) if samples else DEPTH_SPAN_MIN, DEPTH_SPAN_MAX)
    peak = max((max(s.waiting, s.running) for s in samples), default=0)
    scale = (CHART_HEIGHT - 2) / peak if peak else 0.0

    def points(values: list[tuple[datetime, int]]) -> str:
        coords = []
        if len(values) == 1:  # one sample: a short tick, since a line needs two points
            values = [(values[0][0] - span / 120, values[0][1]), values[0]]
        for at, value in values:
            x = CHART_WIDTH * max(0.0, 1 - (now - at) / span)
            coords.append(f"{x:.1f},{CHART_HEIGHT - 1 - value * scale:.1f}")
        return " ".join(coords)

    latest = samples[-1] if samples else None
    return DepthChart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        waiting=points([(s.at, s.waiting) for s in samples]),
        running=points([(s.at, s.running) for s in samples]),
        samples=len(samples),
        peak=peak,
        latest_waiting=latest.waiting if latest else 0,
        latest_running=latest.running if latest else 0,
        since=clock(samples[0].at) if samples else "",
        start=clock(now - span),
        estimated=any(s.estimated for s in samples),
    )


@dataclass(frozen=True)
class CommonError:
    summary: str
    jobs: int
    example: int  # the newest job that failed this way


def common_errors(failures: list[Row], top: int = 5) -> list[CommonError]:
    """The errors most of these failures share, by their one-line summary, most first."""
    groups: dict[str, list[int]] = {}
    for failure in failures:
        groups.setdefault(error_summary(failure["last_error"]), []).append(int(failure["id"]))
    ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), -item[1][0]))
    return [CommonError(summary, len(ids), ids[0]) for summary, ids in ranked[:top]]


def local_time(value: datetime | None) -> str:
    """A wall-clock time as a zone's clock shows it (a timestamp without time zone), to the minute."""
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M")


FILTERS = {
    "span": span,
    "local_time": local_time,
    "when": when,
    "clock": clock,
    "age": age,
    "relative": relative,
    "count": count,
    "error_summary": error_summary,
    "needs_more": needs_more,
    "pretty_json": pretty_json,
    "compact_json": compact_json,
    "percent": percent,
    "error_time": error_time,
}

TESTS = {"raw_json": is_raw_json}

GLOBALS = {
    "JOB_STATES": JOB_STATES,
    "can_retry": can_retry,
    "can_cancel": can_cancel,
    "can_retry_step": can_retry_step,
    "step_kind": step_kind,
}
