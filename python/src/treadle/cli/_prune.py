"""treadle prune: delete finished jobs older than a duration, about --batch-size jobs per transaction.

treadle.prune(older_than) deletes in one statement whatever finished before now - older_than,
with no batch size (apply_retention's batches follow the configured retention, not a cutoff).
On a big backlog that is one long transaction and no sign of life, so this command walks
the finished jobs in finished_at order (jobs_finished_at_idx), finds the time before which
the next --batch-size of them finished, calls prune up to that time, and reports; then the
next window, up to the cutoff.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from treadle._display import when

from ._base import (
    OK,
    Connection,
    Progress,
    add_dsn,
    add_json,
    bounded_int,
    command,
    connect,
    duration,
    print_json,
)

BATCH = 10_000
# the cutoff on the database's clock, and how many finished jobs lie before it (step jobs go with their runs)
BOUNDS = """
SELECT treadle.now() - %(older_than)s::interval AS cutoff,
       (SELECT count(*) FROM treadle.job_details
         WHERE finished_at < treadle.now() - %(older_than)s::interval) AS jobs
"""
# the end of the next window: the first finish time after `start` of the jobs --batch-size places
# on from the oldest left, so after more than a batch that finished at one instant, the next instant
# (prune deletes step jobs with their runs only, so they are not counted); none: the cutoff is near
WINDOW_END = """
SELECT finished_at FROM (
    SELECT finished_at FROM treadle.job_details
     WHERE finished_at >= coalesce(%(start)s::timestamptz, '-infinity') AND finished_at < %(cutoff)s::timestamptz
       AND workflow_run_id IS NULL
     ORDER BY finished_at OFFSET %(size)s) AS beyond
 WHERE finished_at > coalesce(%(start)s::timestamptz, '-infinity')
 ORDER BY finished_at LIMIT 1
"""
# one window: prune's cutoff is `before` exactly (treadle.now() is one value in a statement)
PRUNE_BEFORE = "SELECT treadle.prune(older_than => treadle.now() - %(before)s::timestamptz) AS deleted"


def add_command(commands: Any) -> None:
    prune = command(
        commands,
        "prune",
        "delete finished jobs (and finished workflow runs) older than a duration",
        description=(
            "Delete completed, discarded and cancelled jobs that finished more than --older-than ago, and "
            "finished workflow runs with their step jobs (treadle.prune), oldest first, about --batch-size "
            "jobs per transaction, reporting after each."
        ),
        examples=["treadle prune --older-than 7d", "treadle prune --older-than 12h --dry-run", "treadle prune --json"],
    )
    prune.add_argument(
        "--older-than", default="7d", metavar="DURATION", help="finished longer ago than this (default: 7d)"
    )
    prune.add_argument(
        "--batch-size",
        type=bounded_int(1, 1_000_000),
        default=BATCH,
        help=f"about this many jobs per transaction (default: {BATCH:,})",
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
        cutoff, total = bounds["cutoff"], int(bounds["jobs"])
        if options.dry_run:
            if options.json:
                print_json({"would_delete": total, "finished_before": cutoff})
            else:
                print(f"{total:,} jobs finished before {when(cutoff)} (step jobs go with their runs)")
            return OK
        deleted = 0
        with Progress("pruning", total) as bar:
            for before in _windows(conn, cutoff, options.batch_size):
                row = conn.execute(PRUNE_BEFORE, {"before": before}).fetchone()
                assert row is not None
                deleted += row["deleted"]
                bar.advance(row["deleted"], f"jobs, finished before {when(before)}")
    if options.json:
        print_json({"deleted": deleted, "finished_before": cutoff})
    else:
        print(f"deleted {deleted:,} jobs that finished before {when(cutoff)}")
    return OK


def _windows(conn: Connection, cutoff: datetime, size: int) -> Iterator[datetime]:
    """The end of each window, rising strictly, the last one the cutoff."""
    start: datetime | None = None
    while start is None or start < cutoff:
        row = conn.execute(WINDOW_END, {"start": start, "cutoff": cutoff, "size": size}).fetchone()
        start = cutoff if row is None else row["finished_at"]
        yield start
