"""treadle schedules list: the cron schedules, each next run on its own zone's clock."""

from __future__ import annotations

import argparse
from typing import Any

from treadle import _sql

from ._base import OK, add_dsn, add_json, command, connect, print_json, print_table


def add_commands(commands: Any) -> None:
    schedules = command(
        commands,
        "schedules",
        "the cron schedules (treadle.schedule writes them)",
        examples=["treadle schedules list", "treadle schedules list --json"],
    )
    sub = schedules.add_subparsers(title="commands", required=True, metavar="COMMAND")
    listing = command(sub, "list", "every schedule with its next run in its own time zone")
    add_json(listing)
    add_dsn(listing)
    listing.set_defaults(command=list_schedules)


def list_schedules(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        rows = conn.execute(_sql.SCHEDULES).fetchall()
    if options.json:
        print_json(rows)
        return OK
    if not rows:
        print("no schedules")
        return OK
    print_table(
        ("NAME", "CRON", "TIME ZONE", "JOB", "QUEUE", "NEXT RUN (ITS ZONE)", "JOB ID", "STATE"),
        [
            (
                row["name"],
                row["cron"],
                row["tz"],
                row["job"],
                row["queue"],
                "-" if row["next_run_local"] is None else row["next_run_local"].isoformat(sep=" ", timespec="minutes"),
                "-" if row["job_id"] is None else str(row["job_id"]),
                row["job_state"] or "-",
            )
            for row in rows
        ],
    )
    return OK
