"""The facts the Python package shares with the SQL, read from the installed extension."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from treadle.models import JOB_STATES


def test_job_states_are_the_check_constraints(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'jobs_state_check'"
    ).fetchone()
    assert row is not None
    assert tuple(re.findall(r"'(\w+)'::text", row[0])) == JOB_STATES
