"""A cron schedule in a time zone: a greeting every minute, on the clock of Europe/Paris.

`treadle.schedule` creates a schedule by name, or keeps it when it exists with the same
definition, so every process may call it at start-up. The schedule's current occurrence
is an ordinary job; the statement that finishes it inserts the next one, due at the next
time the expression names on the zone's clock. docs/scheduling.md has the rules (clock
changes, missed times).

The example creates the schedule twice (one schedule, one occurrence), works the queue
until the first occurrence has run (at the start of the next minute: up to a minute),
shows the next run in the schedule's zone, and unschedules it. It speaks SQL through
psycopg, so any client could do the same.

    DATABASE_URL=postgresql://localhost/app python examples/cron_schedule.py
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

DSN = os.environ["DATABASE_URL"]
NAME = "minutely-greeting"
CRON = "* * * * *"
JOB = "greet"
TZ = "Europe/Paris"
QUEUE = "cron-example"


def ensure_schedule(conn: psycopg.Connection) -> int:
    """Create or keep the schedule; every process may call this at start-up."""
    (job_id,) = conn.execute(
        """select treadle.schedule(%s, %s, %s, %s, tz => %s, queue => %s)""",
        [NAME, CRON, JOB, Jsonb({"greeting": "hello"}), TZ, QUEUE],
    ).fetchone()
    return job_id


def greet(args: dict[str, Any]) -> dict[str, Any]:
    return {"said": f"{args['greeting']} from {TZ}"}


def work_until_done(conn: psycopg.Connection, job_id: int, timeout: float = 100) -> dict[str, Any]:
    """Claim and run the queue's jobs until job_id has completed; returns its result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for claimed_id, args, token in conn.execute(
            "select id, args, lease_token from treadle.claim('example-worker', array[%s], lease => '30 seconds')",
            [QUEUE],
        ).fetchall():
            conn.execute("select treadle.complete(%s, %s, %s)", [claimed_id, token, Jsonb(greet(args))])
        state, result = conn.execute("select state, result from treadle.jobs where id = %s", [job_id]).fetchone()
        if state == "completed":
            return result
        time.sleep(0.5)
    raise TimeoutError(f"occurrence {job_id} did not run within {timeout} s")


def main() -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        first = ensure_schedule(conn)
        assert ensure_schedule(conn) == first, "a second start keeps the schedule and its occurrence"
        (due,) = conn.execute("select next_run_local from treadle.schedules where name = %s", [NAME]).fetchone()
        print(f"schedule {NAME!r} ({CRON} in {TZ}): occurrence {first} is due at {due:%H:%M} in {TZ}")

        result = work_until_done(conn, first)
        print(f"occurrence {first} ran:", result)

        second, next_local, state = conn.execute(
            "select job_id, next_run_local, job_state from treadle.schedules where name = %s", [NAME]
        ).fetchone()
        (next_of_first,) = conn.execute("select next_id from treadle.jobs where id = %s", [first]).fetchone()
        print(f"its finish inserted occurrence {second}, due at {next_local:%H:%M} in {TZ} ({state})")

        (removed,) = conn.execute("select treadle.unschedule(%s)", [NAME]).fetchone()
        (left,) = conn.execute("select state from treadle.jobs where id = %s", [second]).fetchone()
        print(f"unscheduled: occurrence {second} is {left}")

    assert result == {"said": f"hello from {TZ}"}, result
    assert second == next_of_first and state == "available", (second, next_of_first, state)
    assert next_local.second == 0 and next_local > due, (next_local, due)
    assert removed and left == "cancelled", (removed, left)


if __name__ == "__main__":
    main()
