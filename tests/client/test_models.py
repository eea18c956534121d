"""The facts the Python package shares with the SQL, read from the installed extension."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import psycopg

from treadle._sql import CLAIMED_DEFERRED, CLAIMED_EAGER, CLAIMED_NAMES
from treadle.models import JOB_STATES, Job


def test_job_states_are_the_check_constraints(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'jobs_state_check'"
    ).fetchone()
    assert row is not None
    assert tuple(re.findall(r"'(\w+)'::text", row[0])) == JOB_STATES


def test_a_claimed_row_is_jobs_fields_in_order_and_every_column_of_the_table(conn: psycopg.Connection[Any]) -> None:
    """Every statement that claims selects _sql.CLAIMED_NAMES (some as columns, the others in
    one record), and the worker makes each row a Job: a column missing there is a field the
    handler never gets."""
    assert CLAIMED_NAMES == tuple(field.name for field in dataclasses.fields(Job))
    assert sorted(CLAIMED_EAGER + tuple(name for name, _ in CLAIMED_DEFERRED)) == sorted(CLAIMED_NAMES)
    columns = [
        name
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'treadle.jobs'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
    ]
    # key_scope and key_period are the idempotency key's bookkeeping (which index holds
    # it), not the job's: treadle.explain reads them
    assert set(CLAIMED_NAMES) == set(columns) - {
        "schedule",
        "ready_txid",
        "key_scope",
        "key_period",
        "concurrency_key",
        "key_slot",
        "run_queue",
    }


def test_a_claimed_jobs_deferred_fields_are_read_as_their_columns_types(conn: psycopg.Connection[Any]) -> None:
    """The claim casts each deferred field to the type _sql.CLAIMED_DEFERRED names, and the
    worker loads it as that type: each must be its column's (jsonb, sent as text, aside)."""
    types = dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'treadle.jobs'::regclass AND attnum > 0 AND NOT attisdropped"
        ).fetchall()
    )
    aliases = {"jsonb": "text", "interval[]": "interval[]", "timestamp with time zone": "timestamptz"}
    assert {name: aliases.get(types[name], types[name]) for name, _ in CLAIMED_DEFERRED} == dict(CLAIMED_DEFERRED)
