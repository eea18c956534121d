"""treadle queues list | pause | resume | set: the queues and their controls.

`queues list` reads the same counts as `treadle status`, one line per queue, beside each
queue's settings (treadle.queue_settings: paused, limits, retention). `pause` and `resume`
call treadle.pause and treadle.resume; `set` changes only the settings it is given, since
treadle.set_queue clears any setting left out.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from treadle import _sql, client
from treadle._display import age, limits_text

from ._base import (
    OK,
    UsageError,
    add_dsn,
    add_json,
    command,
    connect,
    duration,
    print_json,
    print_table,
)

# One row per queue that has jobs or settings, by name: its jobs in each state (job_counts,
# as `treadle status` reads them), how long its oldest due job has waited, and its settings
# (treadle.queue_settings; none and not paused when it has no row there).
QUEUES = """
WITH counts AS (
    SELECT queue,
           coalesce(sum(jobs) FILTER (WHERE state = 'available'), 0)::bigint AS available,
           coalesce(sum(jobs) FILTER (WHERE state = 'running'), 0)::bigint AS running,
           coalesce(sum(jobs) FILTER (WHERE state = 'retryable'), 0)::bigint AS retryable,
           coalesce(sum(jobs) FILTER (WHERE state = 'completed'), 0)::bigint AS completed,
           coalesce(sum(jobs) FILTER (WHERE state = 'discarded'), 0)::bigint AS discarded,
           coalesce(sum(jobs) FILTER (WHERE state = 'cancelled'), 0)::bigint AS cancelled,
           coalesce(sum(jobs) FILTER (WHERE state = 'blocked'), 0)::bigint AS blocked,
           extract(epoch FROM max(oldest_available_age))::float8 AS oldest_waiting_seconds
      FROM treadle.job_counts()
     WHERE queue IS NOT NULL
     GROUP BY queue)
SELECT coalesce(c.queue, s.queue) AS queue,
       coalesce(c.available, 0) AS available, coalesce(c.running, 0) AS running,
       coalesce(c.retryable, 0) AS retryable, coalesce(c.completed, 0) AS completed,
       coalesce(c.discarded, 0) AS discarded, coalesce(c.cancelled, 0) AS cancelled,
       coalesce(c.blocked, 0) AS blocked,
       c.oldest_waiting_seconds, coalesce(s.paused, false) AS paused, s.concurrency, s.rate_limit,
       s.rate_period, s.max_depth, s.retain_completed, s.retain_failed, s.key_limit,
       coalesce(s.key_ordered, false) AS key_ordered
  FROM counts AS c
  FULL JOIN treadle.queue_settings AS s ON s.queue = c.queue
 ORDER BY coalesce(c.queue, s.queue) COLLATE "C"
"""
NONE_WORDS = ("none", "off", "unlimited")


@dataclass(frozen=True)
class Setting:
    """One of set_queue's settings as `queues set` takes it: a flag, and how to read its value."""

    name: str  # set_queue's argument: rate_limit
    kind: str  # "count", "duration" or "switch" (on or off)
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS_FLAGS = (
    Setting("concurrency", "count", "at most N of its jobs running at once, over every worker (1..100000)"),
    Setting("rate_limit", "count", "at most N claims per --rate-period (1..1000000; needs a rate period)"),
    Setting("rate_period", "duration", "the rate limit's period, such as 1s or 1m (over 0, at most 1d)"),
    Setting("max_depth", "count", "an enqueue that would leave more than N waiting jobs fails (1..1000000)"),
    Setting("retain_completed", "duration", "keep its completed jobs this long, such as 7d (0 to 100 years)"),
    Setting("retain_failed", "duration", "keep its discarded and cancelled jobs this long, such as 30d"),
    Setting("key_limit", "count", "at most N jobs of one concurrency key at once (1..100000; none: 1)"),
    Setting("key_ordered", "switch", "on: each concurrency key an ordered lane (one at a time, a failed head blocks)"),
)


def add_commands(commands: Any) -> None:
    queues = command(
        commands,
        "queues",
        "the queues and their controls: list, pause, resume, set",
        examples=[
            "treadle queues list",
            "treadle queues pause mail",
            "treadle queues resume mail",
            "treadle queues set partner-api --concurrency 2 --rate-limit 10 --rate-period 1s",
            "treadle queues set partner-api --concurrency none",
        ],
    )
    sub = queues.add_subparsers(title="commands", required=True, metavar="COMMAND")
    listing = command(sub, "list", "every queue that has jobs or settings: paused, limits, waiting, running, failed")
    add_json(listing)
    add_dsn(listing)
    listing.set_defaults(command=list_queues)

    for verb, help_text in (
        ("pause", "pause a queue: workers claim none of its jobs (running ones go on); enqueue still works"),
        ("resume", "resume a paused queue: its jobs are claimable again and its workers are woken"),
    ):
        parser = command(sub, verb, help_text, examples=[f"treadle queues {verb} mail"])
        parser.add_argument("queue", help="the queue's name")
        add_json(parser)
        add_dsn(parser)
        parser.set_defaults(command=pause_or_resume, verb=verb)

    setting = command(
        sub,
        "set",
        "change a queue's limits and retention; the settings not named stay as they are",
        description=(
            "Change the settings named and keep the others. A count or duration of 'none' (or --clear-NAME) "
            "removes that setting. Whether the queue is paused does not change."
        ),
        examples=[
            "treadle queues set partner-api --concurrency 2",
            "treadle queues set partner-api --rate-limit 10 --rate-period 1s",
            "treadle queues set mail --max-depth 10000 --retain-completed 7d --retain-failed 30d",
            "treadle queues set partner-api --clear-concurrency",
            "treadle queues set webhooks --key-ordered on",
        ],
    )
    setting.add_argument("queue", help="the queue's name")
    for s in SETTINGS_FLAGS:
        metavar = {"count": "N", "duration": "DURATION", "switch": "on|off"}[s.kind]
        removed = "the global retention (treadle.configure)" if s.name.startswith("retain") else "no limit"
        removed = {"key_limit": "1 per key", "key_ordered": "off"}.get(s.name, removed)
        setting.add_argument(s.flag, dest=s.name, metavar=metavar, help=f"{s.help}; 'none' removes it: {removed}")
        setting.add_argument(
            f"--clear-{s.flag[2:]}", dest=f"clear_{s.name}", action="store_true", help=f"remove {s.flag[2:]}"
        )
    add_json(setting)
    add_dsn(setting)
    setting.set_defaults(command=set_queue)


# -- treadle queues list ----------------------------------------------------------------------------


def list_queues(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        listed = conn.execute(QUEUES).fetchall()
    if options.json:
        print_json(listed)
        return OK
    if not listed:
        print("no queues: no job has been enqueued and no queue has settings")
        return OK
    shown = ("available", "retryable", "running", "discarded")
    print_table(
        ("QUEUE", "PAUSED", *(state.upper() for state in shown), "OLDEST WAITING", "LIMITS"),
        [
            (
                q["queue"],
                "paused" if q["paused"] else "-",
                *(f"{q[state]:,}" for state in shown),
                "-" if q["oldest_waiting_seconds"] is None else age(timedelta(seconds=q["oldest_waiting_seconds"])),
                limits_text(q),
            )
            for q in listed
        ],
        right=frozenset({2, 3, 4, 5}),
    )
    return OK


def _settings(row: dict[str, Any] | None) -> dict[str, Any]:
    """A queue's settings as --json gives them: durations in seconds, null for none."""
    names = ("paused", *(s.name for s in SETTINGS_FLAGS))
    if row is None:
        return {"paused": False, **dict.fromkeys(names[1:]), "key_ordered": False}
    return {name: row[name] for name in names}


# -- treadle queues pause | resume ----------------------------------------------------------------


def pause_or_resume(options: argparse.Namespace) -> int:
    queue = _queue_name(options.queue)
    with connect(options) as conn:
        changed = (client.pause if options.verb == "pause" else client.resume)(conn, queue)
    done = "paused" if options.verb == "pause" else "resumed"
    if options.json:
        print_json({"queue": queue, "paused": options.verb == "pause", "changed": changed})
    elif changed:
        print(f"queue {queue}: {done}")
    else:
        print(f"queue {queue}: already {'paused' if options.verb == 'pause' else 'not paused'}")
    return OK


def _queue_name(text: str) -> str:
    # the SQL refuses the rest (empty, too long, control characters) with 22023; NUL never reaches it
    if "\x00" in text:
        raise UsageError("the queue's name contains a NUL character")
    return text


# -- treadle queues set ---------------------------------------------------------------------------


def set_queue(options: argparse.Namespace) -> int:
    queue = _queue_name(options.queue)
    params: dict[str, Any] = {"queue": queue}
    for s in SETTINGS_FLAGS:
        raw, clear = getattr(options, s.name), getattr(options, f"clear_{s.name}")
        if raw is not None and clear:
            raise UsageError(f"{s.flag} and --clear-{s.flag[2:]} contradict each other: give one")
        params[f"given_{s.name}"] = raw is not None or clear
        params[s.name] = None if clear or raw is None else _value(s, raw)
    if not any(params[f"given_{s.name}"] for s in SETTINGS_FLAGS):
        flags = ", ".join(s.flag for s in SETTINGS_FLAGS)
        raise UsageError(f"name a setting to change: {flags} (or --clear-...)")
    with connect(options) as conn, conn.transaction():
        conn.execute(_sql.SET_QUEUE_GIVEN, params)
        row = conn.execute(_sql.QUEUE_SETTINGS_OF, {"queue": queue}).fetchone()
    settings = _settings(row)
    if options.json:
        print_json({"queue": queue, **settings})
    else:
        print(f"queue {queue}: {limits_text(settings)}{' (paused)' if settings['paused'] else ''}")
    return OK


def _value(setting: Setting, raw: str) -> int | timedelta | bool | None:
    text = raw.strip()
    if setting.kind == "switch":
        if text.lower() in ("on", "true", "yes"):
            return True
        if text.lower() in ("off", "false", "no", *NONE_WORDS):
            return False
        raise UsageError(f"{setting.flag}: {raw!r} is not on or off")
    if text.lower() in NONE_WORDS:
        return None
    if setting.kind == "duration":
        return duration(text, setting.flag)
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{setting.flag}: {raw!r} is not a whole number (or 'none' to remove it)") from None
    if not -(2**31) <= value < 2**31:  # the SQL checks the real bounds; this keeps its integer cast whole
        raise UsageError(f"{setting.flag}: {value} is out of range")
    return value
