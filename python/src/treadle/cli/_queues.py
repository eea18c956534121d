"""treadle queues: the queues, and the place for their controls.

`queues list` reads the same counts as `treadle status`, one line per queue. The queue
controls join this group as subcommands once the extension has them: `queues pause QUEUE`
and `queues resume QUEUE` calling treadle.pause(queue) and treadle.resume(queue), and
`queues set QUEUE --option VALUE` calling treadle.set_queue(queue, ...), each a parser
in add_commands and a function that runs one statement on `connect(options)`.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from treadle.models import JOB_STATES

from ._base import OK, add_dsn, add_json, age, command, connect, print_json, print_table
from ._status import counts, seconds_of


def add_commands(commands: Any) -> None:
    queues = command(
        commands,
        "queues",
        "the queues and their controls",
        examples=["treadle queues list", "treadle queues list --json"],
    )
    sub = queues.add_subparsers(title="commands", required=True, metavar="COMMAND")
    listing = command(sub, "list", "every queue that has jobs: waiting, running, failed, oldest waiting")
    add_json(listing)
    add_dsn(listing)
    listing.set_defaults(command=list_queues)


# -- treadle queues list ----------------------------------------------------------------------------


def list_queues(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        rows = counts(conn)
    queues: dict[str, dict[str, Any]] = {}
    for row in rows:
        queue = queues.setdefault(
            row["queue"], {"queue": row["queue"], **dict.fromkeys(JOB_STATES, 0), "oldest_waiting_seconds": None}
        )
        queue[row["state"]] = row["jobs"]
        if row["oldest_available_age"] is not None:
            queue["oldest_waiting_seconds"] = seconds_of(row)
    if options.json:
        print_json(list(queues.values()))
        return OK
    if not queues:
        print("no queues: no job has been enqueued")
        return OK
    shown = ("available", "retryable", "running", "discarded")
    print_table(
        ("QUEUE", *(state.upper() for state in shown), "OLDEST WAITING"),
        [
            (
                q["queue"],
                *(f"{q[state]:,}" for state in shown),
                "-" if q["oldest_waiting_seconds"] is None else age(timedelta(seconds=q["oldest_waiting_seconds"])),
            )
            for q in queues.values()
        ],
        right=frozenset({1, 2, 3, 4}),
    )
    return OK
