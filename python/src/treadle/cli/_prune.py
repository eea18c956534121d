"""treadle prune: delete finished jobs older than a duration, a window of time per transaction.

treadle.prune(older_than) deletes in one statement whatever finished before now - older_than.
On a big backlog that is one long transaction and no sign of life, so this command walks
from the oldest finished job up to the cutoff in --steps windows, one prune call (and one
transaction) each, and reports after each.
"""

from __future__ import annotations

import argparse
from typing import Any

from ._base import (
    OK,
    Progress,
    add_dsn,
    add_json,
    bounded_int,
    command,
    connect,
    duration,
    print_json,
    when,
)

STEPS = 20
# the cutoff on the database's clock, and the oldest finished job (jobs_finished_at_idx finds it)
BOUNDS = """
SELECT treadle.now() - %(older_than)s::interval AS cutoff,
       (SELECT min(finished_at) FROM treadle.jobs WHERE finished_at IS NOT NULL) AS oldest
"""
# how many finished jobs lie before the cutoff (--dry-run; step jobs go with their runs)
BEFORE = "SELECT count(*) AS jobs FROM treadle.jobs WHERE finished_at < treadle.now() - %(older_than)s::interval"
# one window: never later than the cutoff, however long the walk takes
PRUNE_BEFORE = """
SELECT treadle.prune(older_than => greatest(treadle.now() - %(before)s::timestamptz, %(older_than)s::interval))
    AS deleted
"""


def add_command(commands: Any) -> None:
    prune = command(
        commands,
        "prune",
        "delete finished jobs (and finished workflow runs) older than a duration",
        description=(
            "Delete completed, discarded and cancelled jobs that finished more than --older-than ago, and "
            "finished workflow runs with their step jobs (treadle.prune). It walks from the oldest finished "
            "job to the cutoff in --steps windows, one transaction each, reporting after each."
        ),
        examples=["treadle prune --older-than 7d", "treadle prune --older-than 12h --dry-run", "treadle prune --json"],
    )
    prune.add_argument(
        "--older-than", default="7d", metavar="DURATION", help="finished longer ago than this (default: 7d)"
    )
    prune.add_argument(
        "--steps", type=bounded_int(1, 1000), default=STEPS, help=f"windows, one transaction each (default: {STEPS})"
    )
    prune.add_argument("--dry-run", action="store_true", help="count the finished jobs it would delete, and stop")
    add_json(prune)
    add_dsn(prune)
    prune.set_defaults(command=run)


def run(options: argparse.Namespace) -> int:
    older_than = duration(options.older_than, "--older-than")
    with connect(options) as conn:
        bounds = conn.execute(BOUNDS, {"older_than": older_than}).fetchone()
        assert bounds is not None
        cutoff, oldest = bounds["cutoff"], bounds["oldest"]
        if options.dry_run:
            counted = conn.execute(BEFORE, {"older_than": older_than}).fetchone()
            assert counted is not None
            if options.json:
                print_json({"would_delete": counted["jobs"], "finished_before": cutoff})
            else:
                print(f"{counted['jobs']:,} jobs finished before {when(cutoff)} (step jobs go with their runs)")
            return OK
        steps = options.steps if oldest is not None and oldest < cutoff else 1
        deleted = 0
        with Progress("pruning", steps) as bar:
            for step in range(1, steps + 1):
                before = cutoff if step == steps else oldest + (cutoff - oldest) * step / steps
                row = conn.execute(PRUNE_BEFORE, {"before": before, "older_than": older_than}).fetchone()
                assert row is not None
                deleted += row["deleted"]
                bar.advance(1, f"{deleted:,} jobs deleted, finished before {when(before)}")
    if options.json:
        print_json({"deleted": deleted, "finished_before": cutoff})
    else:
        print(f"deleted {deleted:,} jobs that finished before {when(cutoff)}")
    return OK
