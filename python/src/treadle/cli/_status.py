"""treadle status [--watch]: counts that stay cheap on millions of rows.

It reads treadle.job_counts(), which counts exactly up to a size and then takes the finished
states from the planner's statistics (shown with a ~), as the dashboard does.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from datetime import datetime
from typing import Any

from psycopg.rows import DictRow

from treadle import _sql
from treadle._display import age
from treadle.models import JOB_STATES

from ._base import (
    OK,
    CommandError,
    Connection,
    add_dsn,
    add_json,
    command,
    connect,
    json_value,
    print_json,
    table,
)

JOB_COUNTS = """
SELECT queue, state, jobs, estimated, oldest_available_age
  FROM treadle.job_counts()
 WHERE queue IS NOT NULL
 ORDER BY queue, array_position(%(states)s::text[], state)
"""
RICH_HINT = "status --watch draws with rich: pip install 'treadle[cli]'"
WAITING = ("available", "retryable")


def add_commands(commands: Any) -> None:
    status = command(
        commands,
        "status",
        "jobs per queue and state; --watch keeps the table up to date",
        examples=[
            "treadle status",
            "treadle status --watch --interval 5",
            "treadle status --json | jq '.jobs[] | select(.state == \"discarded\")'",
        ],
    )
    status.add_argument("--watch", "-w", action="store_true", help="refresh in place until Ctrl-C")
    status.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between refreshes with --watch (default: 2)",
    )
    add_json(status)
    add_dsn(status)
    status.set_defaults(command=show_status)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 3600 seconds, got {text}")
    return value


def counts(conn: Connection) -> list[DictRow]:
    return conn.execute(JOB_COUNTS, {"states": list(JOB_STATES)}).fetchall()


def _jobs_json(rows: list[DictRow]) -> list[dict[str, Any]]:
    return [
        {
            "queue": row["queue"],
            "state": row["state"],
            "jobs": row["jobs"],
            "estimated": row["estimated"],
            "oldest_waiting_seconds": seconds_of(row),
        }
        for row in rows
    ]


def seconds_of(row: DictRow) -> float | None:
    wait = row["oldest_available_age"]
    return None if wait is None else wait.total_seconds()


def _count(row: DictRow) -> str:
    return f"{'~' if row['estimated'] else ''}{row['jobs']:,}"


def _status_lines(rows: list[DictRow]) -> list[str]:
    if not rows:
        return ["no jobs"]
    return table(
        ("QUEUE", "STATE", "JOBS", "OLDEST WAITING"),
        [(row["queue"], row["state"], _count(row), age(row["oldest_available_age"])) for row in rows],
        right=frozenset({2}),
    )


# -- treadle status ---------------------------------------------------------------------------------


def show_status(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        if options.watch:
            return _watch(conn, options)
        rows = counts(conn)
        treadle = installed_treadle(conn)
        if options.json:
            workers = conn.execute(_sql.LIVE_WORKERS).fetchall()
            print_json({"treadle": treadle, "jobs": _jobs_json(rows), "workers": workers})
        else:
            print("\n".join(_status_lines(rows)))
            print(_treadle_line(treadle))
    return OK


def installed_treadle(conn: Connection) -> dict[str, Any]:
    """The installed treadle's version, form and owner (who runs its definer functions), and
    whether the connecting role may act as that owner."""
    from treadle import install

    current = install.installed(conn)
    if current is None:  # connect() checked it is there
        raise CommandError("treadle is not installed in this database")
    found = install.owner(conn, current.mode)
    return {
        "version": current.version,
        "form": current.mode,
        "owner": found.name,
        "user": found.user,
        "user_may_act_as_owner": found.may_act,
    }


def _treadle_line(treadle: dict[str, Any]) -> str:
    return f"treadle {treadle['version']} ({treadle['form']}), owned by role {treadle['owner']}"


def _watch(conn: Connection, options: argparse.Namespace) -> int:
    """Refresh until Ctrl-C: a live rich table on a terminal; else one snapshot per interval."""
    live = None
    if sys.stdout.isatty() and not options.json:
        try:
            from rich.live import Live
        except ImportError:
            raise CommandError(RICH_HINT) from None
        live = Live(_rich_view(conn, options), auto_refresh=False, screen=False)
        live.start()
    # Ctrl-C ends the loop between refreshes: a KeyboardInterrupt inside a query would
    # leave the connection waiting on a cancelled statement as the command exits. The
    # handler only sets a flag: one that set a threading.Event could deadlock on the
    # Event's own lock, were the signal to arrive while the loop held it in wait().
    stopping: list[bool] = []
    previous = signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    try:
        while not stopping:
            if live is not None:
                live.update(_rich_view(conn, options), refresh=True)
            elif options.json:
                rows = counts(conn)
                workers = conn.execute(_sql.LIVE_WORKERS).fetchall()
                snapshot = {"at": datetime.now().astimezone(), "jobs": _jobs_json(rows), "workers": workers}
                print(json.dumps(snapshot, default=json_value), flush=True)
            else:
                print(f"-- {datetime.now().astimezone().isoformat(timespec='seconds')}")
                print("\n".join(_status_lines(counts(conn))), flush=True)
            _sleep_unless(stopping, options.interval)
        return OK
    finally:
        signal.signal(signal.SIGINT, previous)
        if live is not None:
            live.stop()


def _sleep_unless(stopping: list[bool], seconds: float) -> None:
    """Sleep `seconds`, in slices short enough that Ctrl-C is answered at once."""
    deadline = time.monotonic() + seconds
    while not stopping and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def _rich_view(conn: Connection, options: argparse.Namespace) -> Any:
    from rich.console import Group
    from rich.table import Table

    rows = counts(conn)
    workers = conn.execute(_sql.LIVE_WORKERS).fetchall()
    jobs = Table(
        title=f"treadle status: {conn.info.dbname} ({_treadle_line(installed_treadle(conn))}), "
        f"{datetime.now().astimezone():%H:%M:%S} "
        f"(every {options.interval:g} s, Ctrl-C to stop)",
        title_justify="left",
    )
    for header, justify in (("QUEUE", "left"), ("STATE", "left"), ("JOBS", "right"), ("OLDEST WAITING", "left")):
        jobs.add_column(header, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        style = "red" if row["state"] == "discarded" else "yellow" if row["state"] in WAITING else None
        jobs.add_row(row["queue"], row["state"], _count(row), age(row["oldest_available_age"]), style=style)
    if not rows:
        jobs.add_row("no jobs", "", "", "")
    busy = Table(title=f"{len(workers)} live workers", title_justify="left")
    for header in ("WORKER", "HOST", "PID", "QUEUES", "BUSY"):
        busy.add_column(header)
    for worker in workers:
        busy.add_row(
            worker["id"],
            worker["host"] or "-",
            str(worker["pid"] or "-"),
            ", ".join(worker["queues"] or []) or "all",
            f"{worker['running_jobs']}/{worker['concurrency']}",
        )
    return Group(jobs, busy)
